"""The languages `rlrig sandbox` runs, by SandboxFusion's names: the file the code is written to, how it is compiled
and run, and what to install where its tool is missing.

A command is an argv template: `{py}` is the Python interpreter the sandbox found, `{mem}` the run's memory limit
in MB (for runtimes that take their own heap limit instead of an address-space limit)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    """One language: `source` is the code's file name in the scratch directory; `compile` runs first (None:
    interpreted) and must leave what `run` starts; `tools` are the programs both need on PATH ({py}: the
    sandbox's Python, {pytest}: that Python able to import pytest); `install` is
    what the refusal tells the user to install; address_space: whether RLIMIT_AS can hold its runtime (V8 and the
    JVM reserve far more address space than they use, so they get their own heap flag instead)."""

    name: str
    source: str
    run: tuple[str, ...]
    tools: tuple[str, ...]
    install: str
    compile: tuple[str, ...] | None = None
    address_space: bool = True


LANGUAGES = {
    lang.name: lang
    for lang in (
        Language("python", "main.py", ("{py}", "main.py"), ("{py}",), "Python 3 (python3)"),
        Language(
            "pytest",
            "test_main.py",
            ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_main.py"),
            ("{py}", "{pytest}"),
            "pytest for the sandbox's Python (pip install pytest)",
        ),
        Language("bash", "main.sh", ("bash", "main.sh"), ("bash",), "bash"),
        Language(
            "cpp",
            "main.cpp",
            ("./main",),
            ("g++",),
            "g++ (Debian/Ubuntu: apt-get install g++)",
            compile=("g++", "-std=c++17", "-O2", "-o", "main", "main.cpp"),
        ),
        Language(
            "nodejs",
            "main.js",
            ("node", "--max-old-space-size={mem}", "main.js"),
            ("node",),
            "Node.js (node on PATH; Debian/Ubuntu: apt-get install nodejs)",
            address_space=False,
        ),
        Language(
            "go",
            "main.go",
            ("./main",),
            ("go",),
            "Go (go on PATH, https://go.dev/dl)",
            compile=("go", "build", "-o", "main", "main.go"),
            address_space=False,
        ),
        Language(
            "java",
            "Main.java",
            ("java", "-Xmx{mem}m", "-cp", ".", "Main"),
            ("javac", "java"),
            "a JDK (javac and java; Debian/Ubuntu: apt-get install default-jdk)",
            compile=("javac", "Main.java"),
            address_space=False,
        ),
        Language(
            "rust",
            "main.rs",
            ("./main",),
            ("rustc",),
            "Rust (rustc on PATH, https://rustup.rs)",
            compile=("rustc", "-O", "-o", "main", "main.rs"),
        ),
        Language("perl", "main.pl", ("perl", "main.pl"), ("perl",), "perl"),
        Language("ruby", "main.rb", ("ruby", "main.rb"), ("ruby",), "Ruby (apt-get install ruby)"),
        Language("lua", "main.lua", ("lua", "main.lua"), ("lua",), "Lua (lua on PATH)"),
        Language("php", "main.php", ("php", "main.php"), ("php",), "PHP (apt-get install php-cli)"),
        Language("R", "main.R", ("Rscript", "main.R"), ("Rscript",), "R (Rscript on PATH)"),
        Language("julia", "main.jl", ("julia", "main.jl"), ("julia",), "Julia (julia on PATH)", address_space=False),
    )
}

# the rest of the names SandboxFusion's API lists (verl's SUPPORTED_LANGUAGES): test harnesses, GPUs and toolchains
# that need SandboxFusion's own images
NOT_RUN_HERE = (
    "go_test", "csharp", "typescript", "sql", "cuda", "D_ut", "scala", "junit", "kotlin_script", "jest", "verilog",
    "python_gpu", "lean", "swift", "racket",
)  # fmt: skip


def reachable_by_others(path: str) -> bool:
    """Whether a user other than the file's owner can run `path`: every directory above it searchable and the file
    itself executable by others (what an unprivileged sandbox user needs)."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i])).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IXOTH)


def find_python(unprivileged: bool) -> str | None:
    """The interpreter submissions run with: this process's own, else python3 on PATH, whichever an unprivileged
    sandbox user can run (when submissions run as one)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and (not unprivileged or reachable_by_others(candidate)):
            return candidate
    return None


@dataclass(frozen=True)
class Toolchain:
    """Where each language's tools were found at start-up: `paths` maps a tool to its absolute path."""

    python: str | None
    paths: dict[str, str]

    @classmethod
    def detect(cls, unprivileged: bool) -> Toolchain:
        paths = {}
        for tool in {t for lang in LANGUAGES.values() for t in lang.tools if not t.startswith("{")}:
            found = shutil.which(tool)
            if found and (not unprivileged or reachable_by_others(found)):
                paths[tool] = found
        python = find_python(unprivileged)
        if python and subprocess.run([python, "-c", "import pytest"], capture_output=True, check=False).returncode == 0:
            paths["{pytest}"] = python  # the pytest language: this Python can import pytest
        return cls(python, paths)

    def missing(self, lang: Language) -> list[str]:
        return [t for t in lang.tools if (self.python is None if t == "{py}" else t not in self.paths)]

    def refusal(self, name: str) -> str | None:
        """None where `name` runs here; else the one line that says why not and what to install."""
        lang = LANGUAGES.get(name)
        if lang is None:
            if name in NOT_RUN_HERE:
                return f"language {name} is not run by rlrig sandbox; use a SandboxFusion service for it"
            known = ", ".join(sorted(LANGUAGES))
            return f"language {name!r} is not a language rlrig sandbox knows (it runs: {known})"
        if self.missing(lang):
            return f"language {name} is not available on this sandbox: install {lang.install}"
        return None

    def available(self) -> list[str]:
        return [name for name, lang in LANGUAGES.items() if not self.missing(lang)]

    def argv(self, template: tuple[str, ...], memory_mb: int) -> list[str]:
        out = []
        for i, arg in enumerate(template):
            if arg == "{py}":
                arg = self.python
            elif i == 0 and arg in self.paths:
                arg = self.paths[arg]
            out.append(arg.replace("{mem}", str(memory_mb)))
        return out
