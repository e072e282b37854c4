"""tokmix's one compiled part, optional: the first pass of benchmark decontamination (tokmix/_scan.c, plain C,
no numpy headers). Without a C compiler the install still succeeds (setuptools warns) and tokmix runs the same
first pass in numpy (tokmix.ngrams); the metadata is pyproject.toml's."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tokmix._scan", ["tokmix/_scan.c"], optional=True)])
