"""Small, seeded experiments the book runs (JAX only, CPU friendly).

``match3``  Part VII: one layer of standard attention against one layer of
            third-order (2-simplicial) attention on Sanford et al.'s Match3.
"""
