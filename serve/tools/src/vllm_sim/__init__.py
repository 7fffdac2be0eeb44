"""A vLLM OpenAI-server simulator: the same endpoints, metrics and queueing, no GPU."""

__version__ = "0.1.0"
