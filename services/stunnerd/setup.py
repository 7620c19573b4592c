"""The optional C fast path (`stunnerd._fastpath`); everything else is in pyproject.toml.

`optional=True`: where no C compiler or Python headers are present the build goes on without it
and stunnerd relays in Python (`stunnerd.fastpath.available()` is then False).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stunnerd._fastpath",
            ["src/stunnerd/fastpath/_fastpath.c"],
            depends=[
                "src/stunnerd/fastpath/binding.h",
                "src/stunnerd/fastpath/challenge.h",
                "src/stunnerd/fastpath/relay.h",
                "src/stunnerd/fastpath/routes.h",
            ],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
