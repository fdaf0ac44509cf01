"""llama.cpp from Python: llama-cpp-python's low-level bindings (an optional peer), and the one ggml structure moespec
reads from llama.cpp's graph while it evaluates (a tensor's name, shape, strides and data).

llama-cpp-python builds llama.cpp from source when pip installs it (about 10 minutes on 2 cores); where it is not
installed, `bindings()` says so in one line. LLAMA_CPP_LIB_PATH, the bindings' own setting, makes them load a
libllama built elsewhere (for example beside llama-bench).

Shape legend of GgmlTensor (ggml order: the fastest dimension first)
    ne[0..3]  elements per dimension       nb[0..3]  strides in bytes
    a 2-D view [ne0, ne1] holds row r at data + r nb[1] (rows of a view of a wider tensor are not contiguous)
The layout is ggml.h's `struct ggml_tensor` (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64 bytes, GGML_MAX_SRC 10,
GGML_MAX_NAME 64) of the llama.cpp that llama-cpp-python 0.3.36 vendors.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from moespec import MoespecError

GGML_F32, GGML_I32 = 0, 26  # ggml_type codes of the tensors read here
_NUMPY = {GGML_F32: np.float32, GGML_I32: np.int32}


def bindings() -> Any:
    """The module llama_cpp.llama_cpp (llama-cpp-python's ctypes bindings), or a one-line error."""
    try:
        import llama_cpp.llama_cpp as api  # optional peer (pyproject: peers)
    except ImportError as e:
        raise MoespecError(f"llama.cpp is not available: llama-cpp-python cannot be imported ({e}); "
                           "pip install llama-cpp-python") from None
    except (OSError, RuntimeError) as e:  # the bindings found no loadable libllama
        raise MoespecError(f"llama.cpp is not available: llama-cpp-python cannot load libllama ({e})") from None
    return api


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (module docstring)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]

    def matrix(self) -> np.ndarray:
        """A copy of this 2-D f32 or i32 tensor in host memory as [ne1, ne0] (rows at stride nb[1])."""
        kind = _NUMPY.get(self.type)
        if kind is None or self.ne[2] != 1 or self.ne[3] != 1 or not self.data:
            raise MoespecError(f"llama.cpp tensor {self.name.decode()!r}: not a 2-D f32/i32 tensor in host memory")
        cols, rows, size = self.ne[0], self.ne[1], np.dtype(kind).itemsize
        stride = self.nb[1] // size
        flat = np.ctypeslib.as_array((ctypes.c_byte * (size * (stride * (rows - 1) + cols))).from_address(self.data))
        return np.lib.stride_tricks.as_strided(flat.view(kind), (rows, cols), (self.nb[1], size)).copy()


EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def quiet_log(level: int, text: bytes, data: Any) -> None:
    """A log callback for llama_log_set that keeps llama.cpp's load messages off the terminal."""
