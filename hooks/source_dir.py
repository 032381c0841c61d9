"""A Jinja extension for the hooks: ``{{ source_dir() }}`` is the absolute path of this template.

cookiecutter renders hook scripts with the template directory as the working directory,
then runs them from the new project's directory; ``_repo_dir`` may be relative (``.``).
"""

import os

from jinja2.ext import Extension


class SourceDir(Extension):
    def __init__(self, environment) -> None:
        super().__init__(environment)
        environment.globals["source_dir"] = os.getcwd  # called while the hook is rendered
