"""marl-q: a research sandbox for asynchronous multi-agent RL with optional quantum policy heads."""
__version__ = "0.1.0"
