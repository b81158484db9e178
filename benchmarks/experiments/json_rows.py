"""The experiments' JSON file of result rows: each row printed as it comes and the file rewritten after it, with the
date, GPU, versions and command, so that a run cut short by its time limit keeps what it measured."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import triton


def recorder(out_dir: Path, file_name: str, script: str):
    """(record, rows): ``record(**row)`` appends a row, prints it, and rewrites ``out_dir / file_name``."""
    rows: list[dict] = []
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"

    def record(**row) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out_dir / file_name).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": gpu, "torch": torch.__version__,
            "triton": triton.__version__, "command": f"python {script} " + " ".join(sys.argv[1:]), "rows": rows},
            indent=1))

    return record, rows
