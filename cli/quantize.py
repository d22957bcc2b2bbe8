"""`pyllm quantize`: a GGUF model in fewer bits, as llama-quantize makes it
(pyllm/quantize.py says which tensors get which type).

stderr: each tensor as it is written, then the sizes before and after.
"""
from __future__ import annotations

import os
import time
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path
from .options import OverrideKvOpt, overrides_of


def quantize(
    model: Annotated[str, typer.Argument(help="the model to quantize: a .gguf path or a registry name; its "
                                         "matrices F32, F16 or BF16")],
    output: Annotated[str, typer.Argument(help="the .gguf file to write")],
    type: Annotated[str, typer.Argument(help="Q4_K_M (the usual choice), Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, "
                                        "Q4_0, Q4_1, Q5_0, Q5_1, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, IQ4_XS, IQ4_NL, F16 or BF16")],
    allow_requantize: Annotated[bool, typer.Option("--allow-requantize", help="quantize matrices that are already "
                                                   "quantized (from their dequantized values; it loses more)")] = False,
    pure: Annotated[bool, typer.Option("--pure", help="every matrix in TYPE: no Q6_K output, no _M mix")] = False,
    output_tensor_type: Annotated[Optional[str], typer.Option(
        "--output-tensor-type", help="the output matrix's type (the token embeddings' where they are tied), e.g. "
        "q8_0")] = None,
    token_embedding_type: Annotated[Optional[str], typer.Option(
        "--token-embedding-type", help="the token embeddings' type, e.g. q8_0")] = None,
    imatrix: Annotated[Optional[str], typer.Option(
        "--imatrix", help="an importance matrix (`pyllm imatrix`, or llama-imatrix's GGUF): the quantizers "
        "spend their error where the model's inputs are small")] = None,
    tensor_type_specs: Annotated[list[str], typer.Option(
        "--tensor-type", help="PATTERN=TYPE: the tensors whose names the regular expression matches get TYPE "
        "(e.g. attn_v=q8_0, 'ffn_down=q6_k'); repeatable, the last match winning")] = [],
    leave_output_tensor: Annotated[bool, typer.Option(
        "--leave-output-tensor", help="keep output.weight as it is (more quality, larger file)")] = False,
    override_kv: OverrideKvOpt = [],
) -> None:
    """Quantize a GGUF model to a smaller type (llama-quantize's types and rules)."""
    with handle_errors():
        from pyllm.quantize import FTYPES, quantize_file, tensor_type, tensor_types
        ftype = type.upper()
        if ftype not in FTYPES:
            raise InvalidArgumentError(f"unknown type {type!r}; pyllm quantizes to {', '.join(FTYPES)}")
        path = model_path(model, quiet=True)
        if os.path.isdir(output):
            raise InvalidArgumentError(f"{output} is a folder: give the output file's path")
        t0 = time.perf_counter()

        def progress(name: str, qtype, done: int, total: int) -> None:
            err.print(f"[{done:4d}/{total}] {name:<40} {qtype.name}", highlight=False, soft_wrap=True)
        out_type = None if output_tensor_type is None else tensor_type(output_tensor_type, "--output-tensor-type")
        emb_type = None if token_embedding_type is None else tensor_type(token_embedding_type,
                                                                          "--token-embedding-type")
        p = quantize_file(path, output, ftype, allow_requantize=allow_requantize, pure=pure, progress=progress,
                          output_type=out_type, embedding_type=emb_type, imatrix=imatrix,
                          overrides=overrides_of(override_kv), tensor_overrides=tensor_types(tensor_type_specs),
                          leave_output=leave_output_tensor)
        before, after = p.source_bytes, os.path.getsize(output)
        mix = ", ".join(f"{n} {k}" for k, n in sorted(p.histogram().items(), key=lambda kv: -kv[1]))
        weighed = f"; {len(p.importance)} weighed by {imatrix}" if imatrix else ""
        err.print(f"{output}: {ftype}, {after / 1e6:.1f} MB from {before / 1e6:.1f} MB "
                  f"({after / before:.1%}) in {time.perf_counter() - t0:.1f} s; tensors: {mix}{weighed}",
                  highlight=False, soft_wrap=True)
