"""The sparse kind (SparseEncoder: SPLADE, CSR, and Routers of them): its task, folder reader, torch engines and
onnxruntime graph."""
