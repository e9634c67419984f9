"""The head-side recipe: settings, plan, launch and the `sparks` CLI. Never imports torch."""
