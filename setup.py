"""Build hook: ship the top-level ``hwprofiles/`` directory in the wheel as ``bastion/hwprofiles``.

All other packaging metadata lives in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithProfiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable checkout reads hwprofiles/ in place
        target = Path(self.build_lib) / "bastion" / "hwprofiles"
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted(Path(__file__).parent.joinpath("hwprofiles").glob("*.toml")):
            self.copy_file(str(src), str(target / src.name))


setup(cmdclass={"build_py": BuildPyWithProfiles})
