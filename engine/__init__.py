"""Tensor-parallel serving engine for GLM-5.3-Flash (`glm5_next`). Never imports typer, fabric or docker."""
