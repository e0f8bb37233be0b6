"""Model backends behind the core's protocols.

``bastion.backends.torch`` holds the real backend (Hugging Face targets, DFlash drafters); it
imports torch, so it is imported only when used — importing this package imports nothing heavy.
"""
