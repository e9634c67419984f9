"""The trained demo model (dev-time; needs transformers): `synthetic` writes GLM-format conversations, `trainer`
trains the "chat" preset through transformers' glm5_next on the CPU, `export` writes it in the demo layout,
`evaluate` scores greedy replies from this engine. Commands: `python -m engine train-demo OUT`, `eval-demo DIR`;
the committed result is engine/checkpoint/trained_demo (`make-demo DIR --size trained`)."""
