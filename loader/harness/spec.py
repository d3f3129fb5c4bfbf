"""Card specs: the data that tests, ``kernelkit check``, ``bench`` and ``run`` all read.

A card is ``kernels/<op>.cu`` (the math and device code, torch-free; for elementwise functors also their CPU
loop), ``kernels/<op>.h`` (declarations, plus the torch-facing binding under ``#ifdef KERNELKIT_BINDING``, which
a math edit leaves alone), ``reference/<op>.py`` (pure PyTorch) and a
spec: ``kernels/<op>.py`` defines ``SPEC = kernelkit.Spec(...)`` and may define ``setup(lib)``, called
after every (re)load with the loaded :class:`kernelkit.Library` to register fake/autograd kernels.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

import torch

Shape = Tuple[int, ...]

#: (rtol, atol) by dtype; a card may override any entry through ``Spec.tolerances``.
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tuple[float, float]] = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


@dataclasses.dataclass
class Spec:
    """What kernelkit needs to know about one card besides its sources.

    ``make_inputs(shape, dtype=, device=, generator=)`` returns the op's positional arguments for one
    trial (fresh random values every call; never zeros). ``shape`` is an entry of ``shapes`` (checking)
    or ``bench_sizes`` (timing); what it means is the card's business (for sampling it is ``(d, n)``).
    """

    name: str
    #: pure-PyTorch implementation, same positional signature as the op
    reference: Callable[..., Any]
    make_inputs: Callable[..., tuple]
    #: public op function, e.g. ``kernelkit.ops.sigmoid``; when None, the card's op by name
    #: (``kernelkit.harness.target.card_op``)
    op: Optional[Callable[..., Any]] = None
    #: sources relative to the card's directory; default ``[<name>.cu]`` (or ``<name>.cpp``)
    sources: Optional[Sequence[str]] = None
    header: Optional[str] = None
    extra_cflags: Sequence[str] = ()
    extra_cuda_cflags: Sequence[str] = ()
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    #: devices the card implements ("cuda", "cpu")
    devices: Sequence[str] = ("cuda", "cpu")
    #: shapes for correctness checks (include 1, odd sizes, empty, non-multiples of the vector width)
    shapes: Sequence[Shape] = ((1,), (7,), (1023,), (4097,), (0,), (33, 65))
    #: shapes for benchmark sweeps, smallest first
    bench_sizes: Sequence[Shape] = ((1 << 12,), (1 << 16,), (1 << 20,), (1 << 24,))
    #: bytes the op must move through device memory at minimum, given its args and output
    bytes_moved: Optional[Callable[[tuple, Any], int]] = None
    tolerances: Mapping[torch.dtype, Tuple[float, float]] = dataclasses.field(default_factory=dict)
    #: indices of positional args that take gradients (empty: no backward)
    grad_inputs: Sequence[int] = ()
    #: random op: checked statistically, not by equality; ``target(args) -> (mean, std)`` broadcastable
    #: to the output describes the distribution each output element should follow
    random: bool = False
    target: Optional[Callable[[tuple], Tuple[torch.Tensor, torch.Tensor]]] = None
    doc: str = ""
    # -- optional, read by kernelkit.check / bench (defaults keep older cards valid) --
    #: keyword through which the op writes into a caller-given output (e.g. "out"); check then passes a
    #: NaN-poisoned, guard-banded buffer in half its trials
    out_arg: Optional[str] = None
    #: indices of positional args the op writes in place (exempt from the "inputs unchanged" check)
    mutates: Sequence[int] = ()
    #: check also passes non-contiguous (strided) views of the tensor args; False for ops that document
    #: a contiguity requirement
    noncontiguous: bool = True
    #: shapes with > 2**31 elements, checked only on request (``check(..., large=True)``)
    large_shapes: Sequence[Shape] = ()
    #: dtypes per device where an implementation supports fewer than ``dtypes`` (e.g. {"cpu": (float32,)})
    device_dtypes: Mapping[str, Sequence[torch.dtype]] = dataclasses.field(default_factory=dict)
    #: dtype used for benchmark sweeps
    bench_dtype: torch.dtype = torch.float32
    #: torch's own op for the same computation, same positional signature (e.g. ``torch.sigmoid``): bench's
    #: baseline where there is one (the reference is often a formula written for clarity, not speed)
    torch_op: Optional[Callable[..., Any]] = None
    #: its name in tables (default ``torch.<its __name__>``)
    torch_op_name: Optional[str] = None
    #: kernel-only CUDA files (relative to the card's directory) compiled in-process by NVRTC, as instant
    #: kernels are, instead of by nvcc: a list, or {file: [template instantiations such as "axpy<float>"]}.
    #: The binding launches their kernels by name (``kk::kernel("axpy<float>")``, <kernelkit/kernels.h>);
    #: they are not part of the binding's build, so editing one recompiles only it (tens of milliseconds)
    nvrtc_sources: Union[Sequence[str], Mapping[str, Sequence[str]]] = ()
    #: parameters ``kernelkit.autotune(card)`` chooses among: name -> values, each passed to the card's .cu
    #: files as ``-D<name>=<value>`` (the binding is built once), e.g. ``{"BLOCK": [128, 256, 512]}``
    tune: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)

    def tolerance(self, dtype: torch.dtype) -> Tuple[float, float]:
        if dtype in self.tolerances:
            return self.tolerances[dtype]
        return DEFAULT_TOLERANCES.get(dtype, (1e-5, 1e-6))

    def dtypes_for(self, device: Union[str, torch.device]) -> Sequence[torch.dtype]:
        return tuple(self.device_dtypes.get(torch.device(device).type, self.dtypes))

    def torch_baseline(self) -> Optional[Tuple[str, Callable[..., Any]]]:
        """(name, function) of :attr:`torch_op`, or None."""
        if self.torch_op is None:
            return None
        return self.torch_op_name or f"torch.{getattr(self.torch_op, '__name__', 'op')}", self.torch_op

    def default_sources(self) -> Sequence[str]:
        return list(self.sources) if self.sources is not None else []



def check_inputs_arg(inputs: Any, who: str) -> None:
    """Refuse an ``inputs=`` of ``check``/``bench`` (named by ``who``) that is neither None, a tuple of the
    op's positional arguments nor a ``make_inputs(shape, dtype=, device=, generator=)`` callable: a list of
    argument tuples, say, would be passed to the op as its arguments and fail (or pass) for the wrong reason."""
    if inputs is None or isinstance(inputs, tuple) or callable(inputs):
        return
    hint = "; several argument tuples: pass a callable that returns one tuple per call" if isinstance(inputs, list) \
        else "; one tensor argument x: inputs=(x,)" if isinstance(inputs, torch.Tensor) else ""
    raise TypeError(f"{who}: inputs: expected a tuple of the op's positional arguments or a make_inputs(shape, "
                    f"dtype=, device=, generator=) callable, got {type(inputs).__name__}{hint}")
