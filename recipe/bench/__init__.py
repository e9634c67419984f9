"""`sparks bench`: what it is asked (`options`), the run (`bench`), its HTTP client (`client`), the result and its
JSON (`result`), the PNG (`plot`), the prompts (`prompts/`, package data)."""
