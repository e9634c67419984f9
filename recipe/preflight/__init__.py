"""`sparks doctor` and start's first step: every check of every machine (`preflight`), what a check is (`check`), the
checkpoint's and the link's checks (`checkpoint`, `link`)."""
