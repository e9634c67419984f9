"""What start runs, as a value: the machine facts it is built from (`host`), the plan and its build (`plan`), the
parts a plan is made of (`parts`), the Docker side of a rank (`docker`)."""
