"""`spec.gateway`: the model behind the user's Gateway, as a Gateway API v1 HTTPRoute.

The fields and their limits are those of the HTTPRoute's own ``parentRefs``, ``hostnames``
and path match in Gateway API v1.6.3 (``config/crd/standard/gateway.networking.k8s.io_
httproutes.yaml``), so a model this accepts renders a route the API server accepts.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.rules import Rule
from disagg.api.scheduling import DNS_LABEL, DNS_SUBDOMAIN

HOSTNAME: Final = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
PATH: Final = r"^/(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*$"
GATEWAY_PATTERN_MEANINGS: Final = {
    HOSTNAME: "must be a host name (lowercase letters, digits, '-' and '.'), optionally "
    "starting with '*.'; not an IP address",
    PATH: "must be an absolute path of URL characters (RFC 3986), starting with '/'",
}

Hostname = Annotated[str, Field(min_length=1, max_length=253, pattern=HOSTNAME)]


class GatewayParentReference(ApiModel):
    """A Gateway (or one of its listeners) the route attaches to."""

    name: str = Field(min_length=1, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The Gateway's namespace; the model's when unset. A Gateway in another "
        "namespace must allow routes from this one (its listeners' allowedRoutes).",
    )
    section_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,  # a listener name, as the Gateway API spells it
        description="The listener to attach to; all of the Gateway's listeners that allow "
        "the route when unset.",
    )
    port: int | None = Field(
        default=None, ge=1, le=65535, description="Attach only to listeners on this port."
    )


_PATH_SEGMENTS = (
    "!self.path.contains('//') && !self.path.contains('/./') && "
    "!self.path.contains('/../') && !self.path.endsWith('/.') && "
    "!self.path.endsWith('/..') && !self.path.contains('%2f') && !self.path.contains('%2F')"
)


def _clean_path(path: str) -> bool:
    return not (
        any(part in path for part in ("//", "/./", "/../", "%2f", "%2F"))
        or path.endswith(("/.", "/.."))
    )


class GatewaySpec(ApiModel):
    """Where the model's OpenAI-compatible API appears on the user's Gateway."""

    parent_refs: list[GatewayParentReference] = Field(
        min_length=1,
        max_length=32,
        description="The Gateways the route attaches to (the HTTPRoute's parentRefs).",
    )
    hostnames: list[Hostname] = Field(
        default_factory=list,
        max_length=16,
        description="Host names the route answers for; every host the listeners accept when empty.",
    )
    path: str = Field(
        default="/",
        min_length=1,
        max_length=1024,
        pattern=PATH,
        description="Requests whose path starts with this reach the model's router (a "
        "PathPrefix match), unchanged: the router serves /v1/... itself.",
    )

    rules: ClassVar = (
        Rule(
            cel=_PATH_SEGMENTS,
            message="path must not contain '//', '/./', '/../' or '%2F', nor end with '/.' or "
            "'/..' (the Gateway API refuses such a match)",
            check=lambda spec: _clean_path(spec.path),
            field_path=".path",
        ),
    )
