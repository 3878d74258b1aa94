"""Exercise specifications, one module per chapter (``ch03`` = chapter 3).

Each module defines ``EXERCISES``, a list of :class:`attn_course.registry.Exercise`.
A spec module imports NumPy, JAX and MLX only (never ``attn_tensors``): it is
imported inside workers, where ``attn_tensors`` is the student's package.  Its
probes take array functions and gradients from :mod:`attn_course.specs._gen`
(``xp``, ``grad``), which follow the backend of the arrays they are given.
Shared generators and probes are in :mod:`attn_course.specs._gen`.
"""
