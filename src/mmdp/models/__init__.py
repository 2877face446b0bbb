"""The models a packed batch is fed to.

tiny_vlm    TinyVLM: stage 6's tiny vision-language model (SigLIP + Llama, nanoVLM's shape)
attention   which attention keeps packed samples apart; FlashAttention's routing on a CPU
"""
