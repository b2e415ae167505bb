"""The memory estimator: bytes per device of a training step, in one place.

Modules, bottom to top:

- ``units``: byte sizes, GB and GiB.
- ``states``: model states after ZeRO (params, grads, optimizer states) and the buffers
  DeepSpeed 0.19 holds beside them, on the device and the host.
- ``activations``: activations after Korthikanti et al. 2022, as published and adapted to
  this project's block.
- ``case``: ``MemoryCase`` (what one device's memory depends on) and ``held_states``, what the
  fullest rank holds through a step: the one source of both estimates below.
- ``peak_lines`` and ``peak``: the plan's question, the most a device holds during a step
  (``memory_terms`` -> ``MemoryTerms``).
- ``boundary``: the ledger's question, what a rank holds at the optimizer-step boundary
  (``boundary_estimate`` -> ``Estimate``), and ``deepspeed_estimate``, its case from a run's config.

``ModelStates`` is ZeRO's textbook accounting of the model states (``model_states``), a part
of both. ``runner.memory`` re-exports the per-term estimator API under its long-standing names.
"""
