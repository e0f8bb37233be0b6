"""Build hook for the optional compiled best-first kernel (all metadata is in pyproject.toml).

``optional=True``: where no C compiler is available the install still succeeds and Bastion
falls back to the pure-Python heap, which gives identical trees, only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bastion._bestfirst",
            sources=["bastion/_bestfirst.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
