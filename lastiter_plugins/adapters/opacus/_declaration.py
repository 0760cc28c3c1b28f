"""What the user declared when registering an accountant name (validated by ``register``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

import lastiter_plugins as lp
from lastiter_plugins import host

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._glm_declaration import GlmDeclaration

#: ``register(metric_source=...)``: a rule reading a metric (``ReduceLROnPlateau``, early stopping) reads
#: one computed from data outside the private set, or from released iterates alone
PUBLIC = "public"


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the user declared when registering an accountant name (validated)."""

    name: str
    bound: str
    sampling: lp.Sampling
    relation: lp.Relation
    dataset_size: int
    learning_rate: float | None  # the constant SGD step size (None: the rows that need it leave best)
    assumptions: lp.LossAssumptions
    orders: tuple[float, ...] | None = None
    #: model="glm": the declared loss and feature-norm bound (the assumptions are derived from the model)
    glm: GlmDeclaration | None = None
    #: torch SGD weight_decay per parameter group that the update check accepts as plain SGD (None: 0
    #: everywhere); set by the GLM route, which folds it into the derived constants
    weight_decays: tuple[float, ...] | None = None
    #: l2_outside_clip declared by hand: the weight_decay of every parameter group (the declared strong convexity)
    weight_decay_everywhere: float | None = None
    #: best over bounds whose proof is a published theorem only
    published_only: bool = False
    #: "last_iterate": refuse when no row certifying the final model only is left
    require: Literal["last_iterate"] | None = None
    #: "public": a rule reading a metric (ReduceLROnPlateau) reads one computed outside the private data
    metric_source: Literal["public"] | None = None

    def declaration(self) -> host.Declaration:
        """The host contract's view: the bound, best's restrictions, the orders."""
        return host.Declaration(self.bound, self.published_only, self.require, self.orders)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.glm is not None:  # only then, so that checkpoints of declared runs keep their format
            extra = {"glm": self.glm.to_dict(), "weight_decays": list(self.weight_decays or ())}
        if self.weight_decay_everywhere is not None:
            extra["weight_decay_everywhere"] = self.weight_decay_everywhere
        for key in ("published_only", "require", "metric_source"):
            if getattr(self, key):
                extra[key] = getattr(self, key)
        return {
            **extra,
            "name": self.name,
            "bound": self.bound,
            "sampling": self.sampling.value,
            "relation": self.relation.value,
            "dataset_size": self.dataset_size,
            "learning_rate": self.learning_rate,
            "assumptions": dataclasses.asdict(self.assumptions),
            "orders": None if self.orders is None else list(self.orders),
        }
