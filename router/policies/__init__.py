"""One file per routing policy, all behind `router.base.RoutingPolicy`; `router.registry` builds them by name."""
