"""The models a packed batch is fed to.

inputs        model_inputs(batch, model): what a Hugging Face model takes from a packed batch
gemma3_masks  Gemma 3's and 4's attention masks for packed rows (transformers' are wrong there)
tiny_vlm      TinyVLM: stage 6's tiny vision-language model (SigLIP + Llama, nanoVLM's shape)
tiny          tiny_model(processor): a tiny random model of a real family's class (tests)
attention     which attention keeps packed samples apart; FlashAttention's routing on a CPU

The model families' processor side (what a family makes of a row) is data-side:
mmdp.data.families.
"""
