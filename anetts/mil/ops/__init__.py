"""Op implementations; importing this package registers every op builder."""
from . import (  # noqa: F401
    activation,
    constexpr,
    conv,
    elementwise,
    gather_scatter,
    linalg,
    normalization,
    recurrent,
    reduction,
    resize,
    state,
    tensor_ops,
)
