"""What start runs, as a value: the machine facts it is built from (`host`), the plan and its build (`plan`), the
Docker side of a rank (`docker`)."""
