"""Run logs of rank 0: a CSV file per kind (train.csv, eval.csv) and TensorBoard scalars
(skipped with a warning when tensorboard is not installed)."""
import csv
import io
import warnings
from pathlib import Path
from typing import Dict, Optional

from .files import atomic_write_text

__all__ = ["RunLogger"]

_warned_tensorboard = False


class RunLogger:
    """``log(kind, step, values)`` appends a row to ``<run_dir>/<kind>.csv`` and writes each value
    as the TensorBoard scalar ``<kind>/<name>``. A disabled logger (ranks > 0) does nothing."""

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.writer = None
        self._columns: Dict[str, list] = {}
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                global _warned_tensorboard
                if not _warned_tensorboard:  # once per process, not once per run
                    _warned_tensorboard = True
                    warnings.warn("tensorboard is not installed: TensorBoard logs are skipped (CSV logs are "
                                  "written); pip install tensorboard to get them", stacklevel=2)
            else:
                self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def log(self, kind: str, step: int, values: Dict[str, float]) -> None:
        if not self.enabled:
            return
        path = self.run_dir / f"{kind}.csv"
        columns = self._columns.get(kind)
        if columns is None:
            columns = ["step"] + list(values)
            if path.is_file():  # a resumed run appends under the existing header
                with open(path, newline="") as f:
                    header = next(csv.reader(f), None)
                columns = header or columns
            else:
                with open(path, "w", newline="") as f:
                    csv.writer(f).writerow(columns)
            self._columns[kind] = columns
        unknown = set(values) - set(columns)
        if unknown:
            raise ValueError(f"{kind}.csv has no columns {sorted(unknown)} (columns: {columns})")
        with open(path, "a", newline="") as f:
            csv.writer(f).writerow([step] + [values.get(c, "") for c in columns[1:]])
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(f"{kind}/{name}", value, step)

    def drop_after(self, step: int) -> None:
        """Removes the rows past ``step`` from every CSV: a resumed run rewrites them."""
        if not self.enabled:
            return
        for path in self.run_dir.glob("*.csv"):
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
            kept = rows[:1] + [r for r in rows[1:] if r and int(r[0]) <= step]
            if len(kept) != len(rows):
                out = io.StringIO()
                csv.writer(out).writerows(kept)
                atomic_write_text(path, out.getvalue())

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer: Optional[object] = None
