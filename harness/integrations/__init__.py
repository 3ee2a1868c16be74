"""One line each: the training frameworks' own hooks, reporting to the harness.

``harness.integrations.transformers.ElasticCallback`` for Hugging Face's ``Trainer``,
``harness.integrations.accelerate.ElasticAccelerator`` for an Accelerate loop,
``harness.integrations.lightning.ElasticCallback`` for a Lightning ``Trainer``. Each module
imports its framework (``pip install pytest-elastic[transformers]``, ``[lightning]``) and
nothing of it is imported until that module is; each is a no-op outside the harness, so a
script keeps the line when it trains for real.
"""
