"""Dim names for the axes of an imported program.

Every axis of every value gets a *label*. A label is either named (a dim name given by the user, or
derived from one: ``seq_2``, ``d_model_0``) or a placeholder (an axis made inside the function, e.g. by
a broadcast), which takes the name of the first axis it is paired with (an elementwise operand at the
same position, a contracted axis). Labels are merged with union-find; two labels never merge when a
value holds both (a tensor cannot have one dim twice) or when both are named differently: the importer
then renames one operand (a free IR reshape) instead. Placeholders never paired with a named axis get
a name from their hint at the end.
"""

from __future__ import annotations

from layoutsearch.errors import GraphError


class Labels:
    """Union-find over axis labels, with names, sizes and the values holding each label."""

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._size: list[int] = []
        self._name: list[str | None] = []
        self._hint: list[str] = []
        self._holders: list[set[int]] = []
        self._named: dict[str, int] = {}

    def _add(self, size: int, name: str | None, hint: str) -> int:
        self._parent.append(len(self._parent))
        self._size.append(size)
        self._name.append(name)
        self._hint.append(hint)
        self._holders.append(set())
        return len(self._parent) - 1

    def placeholder(self, size: int, hint: str) -> int:
        """A new unnamed label; ``hint`` names it if it is never paired with a named one."""
        return self._add(size, None, hint)

    def named(self, name: str, size: int) -> int:
        """The label of dim ``name`` (one per name); GraphError when ``name`` had another size."""
        if name in self._named:
            lid = self._named[name]
            if self._size[lid] != size:
                raise GraphError(f"dim {name!r} has size {self._size[lid]} on one axis and {size} on another: "
                                 "give the axes different names")
            return lid
        lid = self._named[name] = self._add(size, name, name)
        return lid

    def named_label(self, name: str) -> int:
        """The label of dim ``name``, given before."""
        return self._named[name]

    def find(self, a: int) -> int:
        while self._parent[a] != a:
            self._parent[a] = self._parent[self._parent[a]]
            a = self._parent[a]
        return a

    def size(self, a: int) -> int:
        return self._size[self.find(a)]

    def name(self, a: int) -> str | None:
        """The label's name, None for a placeholder."""
        return self._name[self.find(a)]

    def base(self, a: int) -> str:
        """The name, or for a placeholder its hint: the stem of names derived from the label."""
        r = self.find(a)
        return self._name[r] or self._hint[r]

    def rename_placeholder(self, a: int, hint: str) -> None:
        """Name placeholder ``a`` (its root) after ``hint`` when the names are given out (:meth:`names`)."""
        r = self.find(a)
        if self._name[r] is None:
            self._hint[r] = hint

    def hold(self, holder: int, labels: tuple[int | None, ...]) -> None:
        """Record that value ``holder`` has axes with ``labels``."""
        for a in labels:
            if a is not None:
                self._holders[self.find(a)].add(holder)

    def same(self, a: int, b: int) -> bool:
        """Make ``a`` and ``b`` one label when allowed; whether they are one label now."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        if self._size[ra] != self._size[rb] or (self._name[ra] and self._name[rb]):
            return False
        if self._holders[ra] & self._holders[rb]:
            return False
        if self._name[ra] is None:
            ra, rb = rb, ra  # keep the named root
        self._parent[rb] = ra
        self._holders[ra] |= self._holders[rb]
        return True

    def fresh(self, a: int, avoid: set[int]) -> int:
        """A label of ``a``'s size, named after ``a`` (``seq`` -> ``seq_2``), whose root is not in ``avoid``."""
        base, size = self.base(a), self.size(a)
        k = 2
        while True:
            name = f"{base}_{k}"
            lid = self._named.get(name)
            if lid is None or (self._size[lid] == size and self.find(lid) not in avoid):
                return self.named(name, size)
            k += 1

    def names(self, labels: set[int]) -> dict[int, str]:
        """Final names of the roots of ``labels``: names as they are; placeholders after their hint
        (``hint``, ``hint_2``, ... avoiding every given or derived name), placeholders of one hint and
        size sharing a name where no value holds both (the same broadcast in every layer)."""
        roots = {self.find(a) for a in labels}
        used: dict[str, tuple[int, set[int]]] = {}  # placeholder name -> (size, holders)
        out: dict[int, str] = {}
        for r in sorted(roots):
            name = self._name[r]
            if name is None:
                hint, k = self._hint[r], 2
                name = hint
                while name in self._named or (name in used and (
                        used[name][0] != self._size[r] or used[name][1] & self._holders[r])):
                    name, k = f"{hint}_{k}", k + 1
                size, holders = used.setdefault(name, (self._size[r], set()))
                holders |= self._holders[r]
            out[r] = name
        return out
