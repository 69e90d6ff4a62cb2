"""Writes metric families as Prometheus text (0.0.4) or OpenMetrics (1.0.0), with label sets cached.

Why not prometheus_client's encoders: they validate and escape every label name and value of
every sample on every render (most of a render's CPU on an 8-GPU node; the ms are in
docs/benchmarks.md, "Figures moved out of docstrings").
Our label names are fixed by the catalogue and checked once (tests/test_metrics_catalogue.py),
and a family's label sets (GPU, leaf, pod identities) rarely change between snapshots, so each set
is escaped once, kept in a bounded cache, and a render only formats values. The output is byte
for byte what prometheus_client's ``generate_latest`` writes for the same families
(tests/test_exposition.py compares them); prometheus_client still formats the floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.utils import floatToGoString

LabelValues = tuple[str, ...]
Samples = Sequence[tuple[LabelValues, float]]
"""One family's samples: the values of its labels (in the family's label order) and the reading."""

MAX_CACHED_LABEL_SETS = 50_000
"""Bound of the label sets an encoder keeps from one render to the next (past it, a render's
further sets are encoded but not kept)."""

EOF = "# EOF\n"


def escape_label_value(value: str) -> str:
    """A label value as written between double quotes: backslash, newline and quote escaped."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _escape_help(text: str, openmetrics: bool) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n")
    return out.replace('"', '\\"') if openmetrics else out


def header(name: str, kind: str, help_: str, openmetrics: bool) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family. ``name`` is the family's name as the
    catalogue spells it (a counter's ends in ``_total``); OpenMetrics names a counter family
    without the suffix, the text format with it, as prometheus_client does."""
    if openmetrics and kind == "counter" and name.endswith("_total"):
        name = name[: -len("_total")]
    return f"# HELP {name} {_escape_help(help_, openmetrics)}\n# TYPE {name} {kind}\n"


class LabelSets:
    """Encoded ``{name="value",...}`` strings of label sets, kept from one render to the next.

    Two generations: the sets this render used and those the render before did. A set used again
    moves into this render's; :meth:`next_render` drops the sets no render used since the one
    before, so a departed pod's series are forgotten after two renders and the cache holds about
    the live series, however many pods have come and gone (a cache that only filled, then cleared
    at a bound, held tens of MiB of dead pods' labels on a node with churn). Labels are written
    sorted by name, as prometheus_client writes them.

    ``constant``: labels every set carries after its own (the exporter's ``node``), given once:
    they are part of each cached set's text, so a render formats them no more often than the
    others."""

    def __init__(self, max_entries: int = MAX_CACHED_LABEL_SETS, constant: Sequence[tuple[str, str]] = ()) -> None:
        self._max = max_entries
        self._constant_names = tuple(name for name, _value in constant)
        self._constant_values = tuple(value for _name, value in constant)
        self._cache: dict[tuple[LabelValues, LabelValues], str] = {}
        self._previous: dict[tuple[LabelValues, LabelValues], str] = {}
        self._order: dict[LabelValues, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._cache) + len(self._previous)

    def next_render(self) -> None:
        """Start a render: the sets of the one before are kept only as this one uses them."""
        if self._cache:
            self._previous, self._cache = self._cache, {}

    def encode(self, names: LabelValues, values: LabelValues) -> str:
        """``{...}`` for these label names and values, or ``""`` without labels."""
        key = (names, values)
        text = self._cache.get(key)
        if text is None:
            text = self._previous.get(key)
            if text is None:
                all_names, all_values = names + self._constant_names, values + self._constant_values
                if not all_names:
                    return ""
                order = self._order.get(names)
                if order is None:
                    order = self._order[names] = tuple(sorted(range(len(all_names)), key=all_names.__getitem__))
                text = "{" + ",".join(f'{all_names[i]}="{escape_label_value(all_values[i])}"' for i in order) + "}"
                if not text.isascii():
                    text.encode()  # a value that is not valid UTF-8 raises here, once per new set
            if len(self._cache) < self._max:
                self._cache[key] = text
        return text


class Family:
    """What the encoder needs of one family: its name, type, help and label names."""

    __slots__ = ("help", "kind", "labels", "name")

    def __init__(self, name: str, kind: str, help_: str, labels: LabelValues) -> None:
        self.name = name
        self.kind = kind
        self.help = help_
        self.labels = labels


class Encoder:
    """Encodes families of samples in either format; one per exposition (it owns a cache).
    ``constant``: labels added to every sample (``LabelSets``)."""

    def __init__(self, max_label_sets: int = MAX_CACHED_LABEL_SETS, constant: Sequence[tuple[str, str]] = ()) -> None:
        self.label_sets = LabelSets(max_label_sets, constant)
        self._headers: dict[tuple[str, bool], str] = {}
        self._texts: dict[tuple[str, bool], tuple[tuple[tuple[LabelValues, float], ...], str]] = {}
        """Each family's samples and text in the last render (kept one render: departed families go)."""
        self._openmetrics = False
        self._current: dict[tuple[str, bool], tuple[tuple[tuple[LabelValues, float], ...], str]] = {}
        """This render's families (``start`` .. ``finish``)."""
        self.reused = 0
        """Families whose text was taken from the render before, since the start (for tests)."""

    def family(self, family: Family, samples: Samples, openmetrics: bool) -> Iterable[str]:
        """The lines of one family (nothing when it has no sample)."""
        if not samples:
            return ()
        key = (family.name, openmetrics)
        head = self._headers.get(key)
        if head is None:
            head = self._headers[key] = header(family.name, family.kind, family.help, openmetrics)
        name, names, encode = family.name, family.labels, self.label_sets.encode
        lines = [head]
        lines.extend(f"{name}{encode(names, values)} {floatToGoString(value)}\n" for values, value in samples)
        return lines

    def encode(self, families: Iterable[tuple[Family, Samples]], openmetrics: bool) -> str:
        """Every family in order; OpenMetrics ends with ``# EOF``: ``start``, ``add`` for each
        family, ``finish``.

        A family whose samples equal the last render's (label values and readings: an idle GPU's
        clocks, limits, identities and most counters) reuses that render's text instead of being
        formatted again.  Samples compare as Python tuples do: a reading that turns from ``0.0``
        to ``-0.0`` keeps its earlier spelling (both parse to zero), and a NaN reads ``NaN``
        whether reused or not."""
        self.start(openmetrics)
        for family, samples in families:
            self.add(family, samples)
        return self.finish()

    def start(self, openmetrics: bool) -> None:
        """Begin a render in one format (the families then come through ``add``)."""
        self.label_sets.next_render()
        self._openmetrics = openmetrics
        self._current = {}

    def add(self, family: Family, samples: Samples) -> None:
        """Format one family of this render (or take its text from the render before).  Raises,
        and keeps nothing of the family, when a label value cannot be written (a value that is not
        valid UTF-8: ``UnicodeEncodeError``), so the caller can drop that family alone."""
        openmetrics = self._openmetrics
        key = (family.name, openmetrics)
        frozen = tuple(samples)
        last = self._texts.get(key)
        if last is not None and last[0] == frozen:
            text = last[1]
            self.reused += 1
        else:
            text = "".join(self.family(family, frozen, openmetrics))
        if text:
            self._current[key] = (frozen, text)

    def finish(self, order: Iterable[str] | None = None) -> str:
        """The text of this render's families, in ``order`` (family names; default: as added)."""
        openmetrics, current = self._openmetrics, self._current
        keys = current if order is None else ((name, openmetrics) for name in order)
        out = [current[k][1] for k in keys if k in current]
        self._texts = {**{k: v for k, v in self._texts.items() if k[1] != openmetrics}, **current}
        self._current = {}
        if openmetrics:
            out.append(EOF)
        return "".join(out)
