"""The sparse kind's torch engines: SPLADE (the masked LM, then SPLADE pooling) and CSR (a dense chain, then a
SparseAutoEncoder), each computed as sentence-transformers computes it; `sparse.SparseTask` runs them per route.

CSR (a `SparseAutoEncoder` over a dense chain): the pooled embedding as the embedding kind computes it (`head.Head`:
the same pooling over the same pooling mask, a prompt's tokens left out where the Pooling says `include_prompt:
false`, and Dense layers; then Normalize if the chain has it), then the autoencoder's encoder as
sentence-transformers runs it at inference (its layer norm if `normalize`, minus `pre_bias`, the linear layer with
`latent_bias`), kept as relu of its latents; the answer's cut (`answers.keep_top`, k = max_active_dims, which the
folder's k defaults; inside a Router, the route's own k, as SparseEncoder takes none from it) then keeps exactly the
positive values among the top k, as its top-k then relu does. A Router's CSR routes share its one transformer, each
with its own chain after it (`CsrEngine.add`).

Memory: the MLM head's logits are rows x padded length x vocabulary floats; a pass is run in row groups of at
most `handler.max_batch_tokens` tokens (`SparseEngine`), so no pass holds more than max_batch_tokens x vocabulary
logits in any strategy, and the worker's ready line says that bound in bytes. A CSR pass holds no vocabulary
logits: rows x hidden_dim latents (4 bytes each) after the encoder's own activations.
"""

from __future__ import annotations

from bucketing.kinds.sparse.routes.csr import CsrEngine as CsrEngine  # each route kind's torch engine, in its module
from bucketing.kinds.sparse.routes.splade import SparseEngine as SparseEngine
