"""The BGE-M3 kind (FlagEmbedding's `BGEM3FlagModel`): dense, sparse (lexical weights) and ColBERT outputs of one
forward pass; its folder reader (`folder`), head (`heads`) and task (`task`)."""
