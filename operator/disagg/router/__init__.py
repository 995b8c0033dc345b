"""The P/D router: the OpenAI-compatible front door; prefill first, then decode."""
