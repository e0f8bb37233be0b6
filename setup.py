"""Build hooks; all other packaging metadata lives in pyproject.toml.

- The optional compiled best-first kernel ``bastion._bestfirst``. ``optional=True``: where no C
  compiler is available the install still succeeds and Bastion falls back to the pure-Python
  heap, which gives identical trees, only slower.
- The optional weight-streaming CPU matrix product ``bastion.backends.torch._cpulinear`` (x86-64
  with AVX-512 or AVX2 + FMA, OpenMP). ``optional=True`` likewise: without it the real backend
  multiplies with PyTorch's own kernels (identical tokens, slower passes on CPU).
- The top-level ``hwprofiles/``, ``workloads/`` and ``experiments/`` directories ship in the
  wheel as ``bastion/hwprofiles``, ``bastion/workloads`` and ``bastion/experiments``.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyWithProfiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable checkout reads these directories in place
        for data in ("hwprofiles", "workloads", "experiments"):
            target = Path(self.build_lib) / "bastion" / data
            target.mkdir(parents=True, exist_ok=True)
            for src in sorted(Path(__file__).parent.joinpath(data).glob("*.toml")):
                self.copy_file(str(src), str(target / src.name))


setup(
    cmdclass={"build_py": BuildPyWithProfiles},
    ext_modules=[
        Extension(
            "bastion._bestfirst",
            sources=[
                "bastion/_bestfirst.c",  # the module and its method table
                "bastion/_bestfirst_tree.c",
                "bastion/_bestfirst_size.c",
                "bastion/_bestfirst_forest.c",
                "bastion/_bestfirst_joint.c",
                "bastion/_bestfirst_learn.c",
                "bastion/_bestfirst_calibrate.c",
                "bastion/_bestfirst_shaped.c",
                "bastion/_bestfirst_draws.c",
                "bastion/_bestfirst_paper.c",
                "bastion/_bestfirst_request.c",
                "bastion/_bestfirst_kv.c",
                "bastion/_bestfirst_chain.c",
            ],
            depends=["bastion/_bestfirst.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "bastion.backends.torch._cpulinear",
            sources=["bastion/backends/torch/_cpulinear.c"],
            extra_compile_args=["-O3", "-fopenmp"],
            extra_link_args=["-fopenmp"],
            optional=True,
        ),
    ],
)
