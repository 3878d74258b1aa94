"""Exercise specifications, one module per chapter (``ch03`` = chapter 3).

Each module defines ``EXERCISES``, a list of :class:`attn_course.registry.Exercise`.
A spec module imports NumPy and JAX only (never ``attn_tensors``): it is
imported inside workers, where ``attn_tensors`` is the student's package.
Shared generators and probes are in :mod:`attn_course.specs._gen`.
"""
