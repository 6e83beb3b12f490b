"""A DataTable that is refilled from data every second without the cursor jumping.

Textual's DataTable keeps rows by key but sorting and filtering here are done on the data
(sorting rendered cells would order "10ms" before "9ms"), so the table is rebuilt in the
wanted order and the cursor is put back on the same key. A plain string cell is drawn as
literal text: a DataTable would read markup in it, and cells carry peer text."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

from tui.format import literal

Cell = str | Text
Row = tuple[str, Sequence[Cell]]


class KeyedTable(DataTable[Cell]):
    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._column_defs = columns
        self._shown: list[tuple[str, tuple[object, ...]]] = []
        self._keep: str | None = None

    def on_mount(self) -> None:
        self._add_columns({})

    def _add_columns(self, labels: dict[str, str]) -> None:
        for key, label in self._column_defs:
            self.add_column(labels.get(key, label), key=key)

    def set_labels(self, labels: dict[str, str]) -> None:
        """Relabel headers (to mark the sort column). Columns are re-added because a
        DataTable sizes a column from its label only when the column is added."""
        self._keep = self.selected_key()
        self.clear(columns=True)
        self._add_columns(labels)
        self._shown = []

    def set_rows(self, rows: Sequence[Row], follow_first: bool = False) -> None:
        """Refill the table, the cursor kept on its row; with ``follow_first``, a cursor on
        the first row (or none) moves to the new first row, so a newest-first list follows."""
        signature = [(key, tuple(_signature(c) for c in cells)) for key, cells in rows]
        if signature == self._shown:
            return
        first = self._shown[0][0] if self._shown else None
        self._shown = signature
        selected = self.selected_key() or self._keep
        self._keep = None
        if follow_first and rows and (selected is None or selected == first):
            selected = rows[0][0]
        self.clear()
        for key, cells in rows:
            self.add_row(*(literal(c) if isinstance(c, str) else c for c in cells), key=key)
        if selected is not None:
            with contextlib.suppress(RowDoesNotExist):
                self.move_cursor(row=self.get_row_index(selected), animate=False)

    def cursor_visible_in_view(self) -> bool:
        """Whether the cursor's row is on screen (scrolling with the wheel can leave it off)."""
        if not self.row_count:
            return False
        top = self.scroll_y
        rows_shown = max(1, self.scrollable_content_region.height - self.header_height)
        return top <= self.cursor_row < top + rows_shown

    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return None if row_key.value is None else str(row_key.value)


def _signature(cell: Cell) -> object:
    """Text compares by identity, so compare what is drawn: characters and styles."""
    if isinstance(cell, str):
        return cell
    return (cell.plain, str(cell.style), tuple(cell.spans))
