"""Running the plan: the executor (`launch`), ranks as containers (`docker`) or ssh processes (`remote`), the run
record (`runstate`), stop and status (`control`), the checks before a start stops anything (`prestart`), rank logs
(`logs`) and the smoke test (`smoke`)."""
