"""The three heads of the published GEMM-shape study.

All three take one FP32 vector of 1024 per item and return 2 logits, with about the same
parameter count (20 matrices of 1024x1024, ~21M parameters); they differ in the GEMM shapes
the GPU sees:

* ``linear_head``: 20 x (Linear 1024->1024 + ReLU), then Linear 1024->2. GEMMs of [B,1024]x[1024,1024].
* ``stacked_head``: 5 heads of 4 such layers, fused with ``bmm`` ([5,B,1024]x[5,1024,1024]);
  the 5 heads' logits are averaged.
* ``seqlen_head``: the input is expanded to [B,128,1024] (plus a learned position table), then 20 x
  (Linear + LayerNorm + ReLU), mean-pooled over the 128 positions, then Linear 1024->2.
  GEMMs of [128B,1024]x[1024,1024]: 128 times the arithmetic per item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from inflight.models.spec import ModelSpec, TensorSpec

if TYPE_CHECKING:
    import torch

WIDTH = 1024
DEPTH = 20
STACK = 5
POSITIONS = 128


def _init(m: torch.nn.Module, seed: int) -> torch.nn.Module:
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() > 1:
                torch.nn.init.kaiming_uniform_(p, a=5**0.5) if p.dim() == 2 else p.normal_(0, WIDTH**-0.5)
            elif "ln" not in name:
                p.uniform_(-(WIDTH**-0.5), WIDTH**-0.5)
    return m.eval()


def make_linear(seed: int = 0, *, fused_epilogue: bool = True) -> torch.nn.Module:
    """``linear_head`` in fp32 on the CPU.

    Args:
        seed: Weight seed.
        fused_epilogue: Run each hidden layer as one ``torch._addmm_activation`` (on a GPU a
            cuBLASLt GEMM whose epilogue adds the bias and applies the ReLU: one kernel per layer,
            no separate ReLU pass over the activations). False: ``nn.Linear`` then ``nn.ReLU``, the
            published head. Same weights and the same output either way.
    """
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, 2))

    class LinearHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(*layers)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            if not fused_epilogue:
                return self.body(features).float()
            x = features
            for fc in cast("list[nn.Linear]", list(self.body)[:-1:2]):
                x = torch._addmm_activation(fc.bias, x, fc.weight.t())
            return self.body[-1](x).float()

    return _init(LinearHead(), seed)


def make_stacked(seed: int = 0) -> torch.nn.Module:
    """``stacked_head`` in fp32 on the CPU."""
    import torch
    from torch import nn

    per_head = DEPTH // STACK

    class StackedHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterList([nn.Parameter(torch.empty(STACK, WIDTH, WIDTH)) for _ in range(per_head)])
            self.b = nn.ParameterList([nn.Parameter(torch.empty(STACK, 1, WIDTH)) for _ in range(per_head)])
            self.w_out = nn.Parameter(torch.empty(STACK, WIDTH, 2))
            self.b_out = nn.Parameter(torch.empty(STACK, 1, 2))

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            x = features.unsqueeze(0).expand(STACK, -1, -1)
            for w, b in zip(self.w, self.b, strict=True):
                x = torch.relu(torch.baddbmm(b, x, w))
            return torch.baddbmm(self.b_out, x, self.w_out).mean(0).float()

    return _init(StackedHead(), seed)


def make_seqlen(seed: int = 0) -> torch.nn.Module:
    """``seqlen_head`` in fp32 on the CPU."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(WIDTH, WIDTH)
            self.ln = nn.LayerNorm(WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.ln(self.fc(x)))

    class SeqlenHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.positions = nn.Parameter(torch.empty(POSITIONS, WIDTH))
            self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
            self.out = nn.Linear(WIDTH, 2)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            x = features[:, None, :] + self.positions[None]
            return self.out(self.blocks(x).mean(1)).float()

    return _init(SeqlenHead(), seed)


def _spec(
    name: str,
    description: str,
    make: object,
    *,
    gpu_compile: str,
    reference: dict[str, bool] | None = None,
    portable: dict[str, bool] | None = None,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        description=description,
        inputs=(TensorSpec(name="features", dtype="float32", dims=(WIDTH,)),),
        outputs=(TensorSpec(name="logits", dtype="float32", dims=(2,)),),
        max_batch_size=2048,
        make_module=make,  # type: ignore[arg-type]
        portable_options=portable or {},
        reference_options=reference or {},
        gpu_compile=gpu_compile,  # type: ignore[arg-type]
    )


# gpu_compile: measured on an H200 (results/engine-heads): linear_head's layers are one cuBLASLt
# kernel each, which inductor would split into a GEMM and a ReLU kernel; stacked_head runs as fast
# eager as compiled and loads faster; inductor fuses seqlen_head's LayerNorm and ReLU into one pass
LINEAR_SPEC = _spec(
    "linear_head",
    "20 x Linear(1024->1024)+ReLU, then ->2",
    make_linear,
    gpu_compile="none",
    reference={"fused_epilogue": False},
    portable={"fused_epilogue": False},  # ONNX has no _addmm_activation
)
STACKED_SPEC = _spec("stacked_head", "5 heads x 4 layers fused with bmm, averaged", make_stacked, gpu_compile="none")
SEQLEN_SPEC = _spec(
    "seqlen_head",
    "expand to [B,128,1024], 20 x Linear+LayerNorm+ReLU, pool, ->2",
    make_seqlen,
    gpu_compile="inductor",
)
