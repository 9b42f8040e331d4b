"""Write GGUF variants of the starter model for cases the starter itself cannot show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


def copy_with_metadata(
    src: Path, dst: Path, extra: dict[str, Any], *, arch: str | None = None
) -> Path:
    """Copy a GGUF, adding or replacing integer/string key-values (weights unchanged);
    `arch` replaces general.architecture."""
    reader = gguf.GGUFReader(src, "r")
    arch = arch or str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in extra:
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, value in extra.items():
        if isinstance(value, list):
            writer.add_array(name, value)
            continue
        vtype = gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.UINT32
        writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        # for quantized types the reader's data shape is in bytes, which the writer expects
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, int(t.data.nbytes),
                               t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    return dst
