"""The student of the embedded distillation demonstration (`rlrig train --preset distill`): the embedded model's
architecture and tokenizer, pre-trained on the arithmetic task for a fraction of the teacher's warm-up steps, so it
writes the answer format but is far less often right. The teacher is the embedded model itself (tiny_model.py).
Seeded, built offline and cached, like the teacher."""

from __future__ import annotations

from pathlib import Path

from .tiny_model import build_model, build_tokenizer, cache_dir, save_atomically, warm_up

STUDENT_WARMUP_STEPS = 40  # of the teacher's 120 (tiny_model.WARMUP_STEPS)


def student_dir() -> Path:
    return cache_dir().parent / f"tiny-arith-student-v1-{STUDENT_WARMUP_STEPS}"


def ensure_student(path: Path | None = None) -> str:
    """Build (once) and return the directory of the student."""
    path = path or student_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    tok = build_tokenizer()
    model = build_model(tok, seed=1)
    warm_up(model, tok, STUDENT_WARMUP_STEPS, seed=1)
    return save_atomically(path, model, tok)
