"""An LLM job: model spec, parallel layout, memory per GPU, kernel times, host overhead."""
