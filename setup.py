"""The one C extension, which pyproject.toml cannot declare without a warning (experimental there).

``streamrt._viewcache`` is KernelContext.array's hit path (src/streamrt/views.py). It is optional:
where no C compiler or Python headers are, pip installs without it and the same behaviour runs in
Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("streamrt._viewcache", ["src/streamrt/_viewcache.c"], optional=True)])
