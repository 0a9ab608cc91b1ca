"""`vaswani serve`: an HTTP translation server with dynamic batching (LibreTranslate's API and our own)."""
