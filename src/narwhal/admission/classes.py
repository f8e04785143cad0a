"""Priority classes (sans-IO): which class a request runs in, and what a class is given.

Classes are named in `admission.classes`, highest first; inside Narwhal a class is its
rank there (0 is the highest). A request chooses its class with the header
`X-Narwhal-Priority: <class>`; without it, it runs in its tenant's default class. A
tenant may be held to a highest class (`tenants.<name>.max_class`): a request asking for
more is clamped to it, not refused, as a client cannot know its tenant's limit. An
unknown class, an empty value or the header given twice is a 400 naming the header.

What a class is given, besides its place in the admission queue (`queue.py`):

- budget share: the predictive check admits a request only while its projected first
  token fits `share(rank)` of the budget, `(1 - class_headroom) ** rank`: 1, 0.75, 0.56
  by default. Under overload the lowest class is refused first; the classes above it
  find the room it leaves, and keep their budget. Where a tenant is over its fair share
  of the work (`tenants.py`), classes rank by it too (`standing_rank`).
- reserved prefill slots (`admission.reserved_prefill`): slots of the global prefill
  limit that only that class or a higher one may take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from narwhal.config import AdmissionConfig
from narwhal.errors import InvalidRequest
from narwhal.protocol.headers import PRIORITY as HEADER


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    names: tuple[str, ...]
    default: int  # the rank of admission.default_class
    headroom: float
    aging_s: float | None
    reserved: tuple[int, ...]  # prefill slots reserved for each rank

    @classmethod
    def from_config(cls, admission: AdmissionConfig) -> PriorityClasses:
        names = admission.classes
        return cls(
            names=names,
            default=names.index(admission.default_class_name),
            headroom=admission.class_headroom,
            aging_s=admission.class_aging_s,
            reserved=tuple(admission.reserved_prefill.get(name, 0) for name in names),
        )

    def rank(self, name: str) -> int:
        return self.names.index(name)

    def share(self, rank: float) -> float:
        """The share of the TTFT budget a request of this class is admitted within."""
        return float((1.0 - self.headroom) ** rank)

    def standing_rank(self, rank: int, standing: str) -> float:
        """Where a request ranks for the budget, by its tenant's standing against its
        fair share of the work (`tenants.py`): `even`, at its class; `over`, its highest
        class where it is (a critical request is critical whoever sends it), any other
        well below every class of the others (half as far again below the lowest as the
        lowest is below the highest); `owed` (another tenant is over its share), its
        classes half as far apart, so that a fair tenant keeps room for its longest
        prompts. Under overload the tenant that floods is refused first."""
        if standing == "over":
            return 0 if rank == 0 else rank + 1.5 * (len(self.names) - 1)
        if standing == "owed":
            return rank / 2
        return rank

    def reserved_prefill(self, rank: int) -> int:
        """The prefill slots reserved for this class: the classes below it may not take
        them while it does not use them."""
        return self.reserved[rank]

    def choose(self, values: Sequence[str], *, default: int, highest: int) -> int:
        """The rank a request runs at: the header's class (`values`: every value it was
        given), else `default`; never above `highest`. InvalidRequest naming the header
        for a value that names no class."""
        if not values:
            return max(default, highest)
        if len(values) > 1:
            raise InvalidRequest(f"Give the {HEADER} header once.", param=HEADER)
        wanted = values[0].strip().lower()
        for rank, name in enumerate(self.names):
            if name.lower() == wanted:
                return max(rank, highest)
        raise InvalidRequest(
            f"{HEADER} must name a class, one of: {', '.join(self.names)}.", param=HEADER
        )
