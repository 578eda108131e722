"""Drafter distillation: prompt set and self-distilled data, objective, trainer,
checkpoints."""
