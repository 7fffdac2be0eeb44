"""OpenAI-compatible gateway in front of vLLM."""

__version__ = "0.1.0"
