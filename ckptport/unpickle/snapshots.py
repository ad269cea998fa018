"""Snapshots of torch facts the torch-free readers need, taken from torch 2.13.0+cpu.

``import torch`` costs seconds; ``inspect`` and ``check`` must not pay it to
know which globals plain ``torch.load(weights_only=True)`` accepts, which
names a pickled tensor's state may not set (``tests/test_inspect.py`` checks
both against the installed torch), or what the names of a pickled model
reach (``tests/unpickle/test_reach.py``).
"""

from __future__ import annotations

__all__ = ["TORCH_DEFAULT_NAMES", "TENSOR_ATTRIBUTES", "TORCH_NN_CLASSES",
           "TORCH_NN_FUNCTIONS"]

# torch._weights_only_unpickler._get_allowed_globals(): what a consumer's plain
# torch.load(weights_only=True) builds with no allow-list of its own
TORCH_DEFAULT_NAMES = frozenset({
    '_codecs.encode', 'builtins.bytearray', 'builtins.complex', 'builtins.set',
    'collections.Counter', 'collections.OrderedDict', 'torch.BFloat16Storage',
    'torch.BFloat16Tensor', 'torch.BoolStorage', 'torch.BoolTensor', 'torch.ByteStorage',
    'torch.ByteTensor', 'torch.CharStorage', 'torch.CharTensor',
    'torch.ComplexDoubleStorage', 'torch.ComplexFloatStorage', 'torch.DoubleStorage',
    'torch.DoubleTensor', 'torch.FloatStorage', 'torch.FloatTensor', 'torch.HalfStorage',
    'torch.HalfTensor', 'torch.IntStorage', 'torch.IntTensor', 'torch.LongStorage',
    'torch.LongTensor', 'torch.QInt32Storage', 'torch.QInt8Storage',
    'torch.QUInt2x4Storage', 'torch.QUInt4x2Storage', 'torch.QUInt8Storage',
    'torch.ShortStorage', 'torch.ShortTensor', 'torch.Size', 'torch.Tensor',
    'torch._tensor._rebuild_from_type_v2',
    'torch._utils._rebuild_device_tensor_from_cpu_tensor',
    'torch._utils._rebuild_device_tensor_from_numpy',
    'torch._utils._rebuild_meta_tensor_no_storage', 'torch._utils._rebuild_nested_tensor',
    'torch._utils._rebuild_parameter', 'torch._utils._rebuild_parameter_with_state',
    'torch._utils._rebuild_qtensor', 'torch._utils._rebuild_sparse_tensor',
    'torch._utils._rebuild_tensor', 'torch._utils._rebuild_tensor_v2',
    'torch._utils._rebuild_tensor_v3', 'torch._utils._rebuild_wrapper_subclass',
    'torch.bfloat16', 'torch.bits16', 'torch.bits1x8', 'torch.bits2x4', 'torch.bits4x2',
    'torch.bits8', 'torch.bool', 'torch.complex128', 'torch.complex32', 'torch.complex64',
    'torch.cuda.BFloat16Storage', 'torch.cuda.BFloat16Tensor', 'torch.cuda.BoolStorage',
    'torch.cuda.BoolTensor', 'torch.cuda.ByteStorage', 'torch.cuda.ByteTensor',
    'torch.cuda.CharStorage', 'torch.cuda.CharTensor', 'torch.cuda.ComplexDoubleStorage',
    'torch.cuda.ComplexFloatStorage', 'torch.cuda.DoubleStorage',
    'torch.cuda.DoubleTensor', 'torch.cuda.FloatStorage', 'torch.cuda.FloatTensor',
    'torch.cuda.HalfStorage', 'torch.cuda.HalfTensor', 'torch.cuda.IntStorage',
    'torch.cuda.IntTensor', 'torch.cuda.LongStorage', 'torch.cuda.LongTensor',
    'torch.cuda.ShortStorage', 'torch.cuda.ShortTensor',
    'torch.cuda.sparse.BFloat16Tensor', 'torch.cuda.sparse.ByteTensor',
    'torch.cuda.sparse.CharTensor', 'torch.cuda.sparse.DoubleTensor',
    'torch.cuda.sparse.FloatTensor', 'torch.cuda.sparse.HalfTensor',
    'torch.cuda.sparse.IntTensor', 'torch.cuda.sparse.LongTensor',
    'torch.cuda.sparse.ShortTensor', 'torch.device', 'torch.float16', 'torch.float32',
    'torch.float4_e2m1fn_x2', 'torch.float64', 'torch.float8_e4m3fn',
    'torch.float8_e4m3fnuz', 'torch.float8_e5m2', 'torch.float8_e5m2fnuz',
    'torch.float8_e8m0fnu', 'torch.int1', 'torch.int16', 'torch.int2', 'torch.int3',
    'torch.int32', 'torch.int4', 'torch.int5', 'torch.int6', 'torch.int64', 'torch.int7',
    'torch.int8', 'torch.nn.parameter.Parameter', 'torch.per_channel_affine',
    'torch.per_channel_affine_float_qparams', 'torch.per_channel_symmetric',
    'torch.per_tensor_affine', 'torch.per_tensor_symmetric', 'torch.qint32', 'torch.qint8',
    'torch.quint2x4', 'torch.quint4x2', 'torch.quint8', 'torch.serialization._get_layout',
    'torch.sparse.BFloat16Tensor', 'torch.sparse.ByteTensor', 'torch.sparse.CharTensor',
    'torch.sparse.DoubleTensor', 'torch.sparse.FloatTensor', 'torch.sparse.HalfTensor',
    'torch.sparse.IntTensor', 'torch.sparse.LongTensor', 'torch.sparse.ShortTensor',
    'torch.storage.TypedStorage', 'torch.storage.UntypedStorage', 'torch.uint1',
    'torch.uint16', 'torch.uint2', 'torch.uint3', 'torch.uint32', 'torch.uint4',
    'torch.uint5', 'torch.uint6', 'torch.uint64', 'torch.uint7', 'torch.uint8',
})

# dir(torch.Tensor) | dir(torch.nn.Parameter): attributes a pickled state must
# not set, since setattr on them rewrites the tensor (``data``, ``real``, ...)
TENSOR_ATTRIBUTES = frozenset({
    'H', 'T', '__abs__', '__add__', '__and__', '__annotations__', '__array__',
    '__array_priority__', '__array_wrap__', '__bool__', '__class__', '__complex__',
    '__contains__', '__cuda_array_interface__', '__deepcopy__', '__delattr__',
    '__delitem__', '__dict__', '__dir__', '__div__', '__dlpack__',
    '__dlpack_c_exchange_api__', '__dlpack_device__', '__doc__', '__eq__', '__float__',
    '__floordiv__', '__format__', '__ge__', '__getattribute__', '__getitem__',
    '__getstate__', '__gt__', '__hash__', '__iadd__', '__iand__', '__idiv__',
    '__ifloordiv__', '__ilshift__', '__imod__', '__imul__', '__index__', '__init__',
    '__init_subclass__', '__int__', '__invert__', '__ior__', '__ipow__', '__irshift__',
    '__isub__', '__iter__', '__itruediv__', '__ixor__', '__le__', '__len__', '__long__',
    '__lshift__', '__lt__', '__matmul__', '__mod__', '__module__', '__mul__', '__ne__',
    '__neg__', '__new__', '__nonzero__', '__or__', '__pos__', '__pow__', '__radd__',
    '__rand__', '__rdiv__', '__reduce__', '__reduce_ex__', '__repr__', '__reversed__',
    '__rfloordiv__', '__rlshift__', '__rmatmul__', '__rmod__', '__rmul__', '__ror__',
    '__rpow__', '__rrshift__', '__rshift__', '__rsub__', '__rtruediv__', '__rxor__',
    '__setattr__', '__setitem__', '__setstate__', '__sizeof__', '__str__', '__sub__',
    '__subclasshook__', '__torch_dispatch__', '__torch_function__', '__truediv__',
    '__weakref__', '__xor__', '_addmm_activation', '_autocast_to_full_precision',
    '_autocast_to_reduced_precision', '_backward_hooks', '_base', '_cdata',
    '_clear_non_serializable_cached_data', '_coalesced_', '_conj', '_conj_physical',
    '_dimI', '_dimV', '_dtensor__new__', '_fix_weakref', '_grad', '_grad_fn',
    '_has_symbolic_sizes_strides', '_indices', '_is_all_true', '_is_any_true', '_is_view',
    '_is_zerotensor', '_lazy_clone', '_make_subclass', '_make_wrapper_subclass',
    '_neg_view', '_nested_tensor_size', '_nested_tensor_storage_offsets',
    '_nested_tensor_strides', '_nnz', '_philox_normal_', '_philox_uniform_',
    '_post_accumulate_grad_hooks', '_python_dispatch', '_reduce_ex_internal',
    '_rev_view_func_unsafe', '_sparse_mask_projection', '_to_dense', '_to_sparse',
    '_to_sparse_bsc', '_to_sparse_bsr', '_to_sparse_csc', '_to_sparse_csr',
    '_typed_storage', '_use_count', '_values', '_version', '_view_func',
    '_view_func_unsafe', 'abs', 'abs_', 'absolute', 'absolute_', 'acos', 'acos_', 'acosh',
    'acosh_', 'add', 'add_', 'addbmm', 'addbmm_', 'addcdiv', 'addcdiv_', 'addcmul',
    'addcmul_', 'addmm', 'addmm_', 'addmv', 'addmv_', 'addr', 'addr_', 'adjoint', 'all',
    'allclose', 'amax', 'amin', 'aminmax', 'angle', 'any', 'apply_', 'arccos', 'arccos_',
    'arccosh', 'arccosh_', 'arcsin', 'arcsin_', 'arcsinh', 'arcsinh_', 'arctan', 'arctan2',
    'arctan2_', 'arctan_', 'arctanh', 'arctanh_', 'argmax', 'argmin', 'argsort',
    'argwhere', 'as_strided', 'as_strided_', 'as_strided_scatter', 'as_subclass', 'asin',
    'asin_', 'asinh', 'asinh_', 'atan', 'atan2', 'atan2_', 'atan_', 'atanh', 'atanh_',
    'backward', 'baddbmm', 'baddbmm_', 'bernoulli', 'bernoulli_', 'bfloat16', 'bincount',
    'bitwise_and', 'bitwise_and_', 'bitwise_left_shift', 'bitwise_left_shift_',
    'bitwise_not', 'bitwise_not_', 'bitwise_or', 'bitwise_or_', 'bitwise_right_shift',
    'bitwise_right_shift_', 'bitwise_xor', 'bitwise_xor_', 'bmm', 'bool', 'broadcast_to',
    'byte', 'cauchy_', 'ccol_indices', 'cdouble', 'ceil', 'ceil_', 'cfloat', 'chalf',
    'char', 'cholesky', 'cholesky_inverse', 'cholesky_solve', 'chunk', 'clamp', 'clamp_',
    'clamp_max', 'clamp_max_', 'clamp_min', 'clamp_min_', 'clip', 'clip_', 'clone',
    'coalesce', 'col_indices', 'conj', 'conj_physical', 'conj_physical_', 'const_data_ptr',
    'contiguous', 'copy_', 'copysign', 'copysign_', 'corrcoef', 'cos', 'cos_', 'cosh',
    'cosh_', 'count_nonzero', 'cov', 'cpu', 'cross', 'crow_indices', 'cuda', 'cummax',
    'cummin', 'cumprod', 'cumprod_', 'cumsum', 'cumsum_', 'data', 'data_ptr', 'deg2rad',
    'deg2rad_', 'dense_dim', 'dequantize', 'det', 'detach', 'detach_', 'device', 'diag',
    'diag_embed', 'diagflat', 'diagonal', 'diagonal_scatter', 'diff', 'digamma',
    'digamma_', 'dim', 'dim_order', 'dist', 'div', 'div_', 'divide', 'divide_', 'dot',
    'double', 'dsplit', 'dtype', 'eig', 'element_size', 'eq', 'eq_', 'equal', 'erf',
    'erf_', 'erfc', 'erfc_', 'erfinv', 'erfinv_', 'exp', 'exp2', 'exp2_', 'exp_', 'expand',
    'expand_as', 'expm1', 'expm1_', 'exponential_', 'fill_', 'fill_diagonal_', 'fix',
    'fix_', 'flatten', 'flip', 'fliplr', 'flipud', 'float', 'float_power', 'float_power_',
    'floor', 'floor_', 'floor_divide', 'floor_divide_', 'fmax', 'fmin', 'fmod', 'fmod_',
    'frac', 'frac_', 'frexp', 'gather', 'gcd', 'gcd_', 'ge', 'ge_', 'geometric_', 'geqrf',
    'ger', 'get_device', 'grad', 'grad_dtype', 'grad_fn', 'greater', 'greater_',
    'greater_equal', 'greater_equal_', 'gt', 'gt_', 'half', 'hardshrink', 'hash_tensor',
    'heaviside', 'heaviside_', 'histc', 'histogram', 'hsplit', 'hypot', 'hypot_', 'i0',
    'i0_', 'igamma', 'igamma_', 'igammac', 'igammac_', 'imag', 'index', 'index_add',
    'index_add_', 'index_copy', 'index_copy_', 'index_fill', 'index_fill_', 'index_put',
    'index_put_', 'index_reduce', 'index_reduce_', 'index_select', 'indices', 'inner',
    'int', 'int_repr', 'inverse', 'ipu', 'is_coalesced', 'is_complex', 'is_conj',
    'is_contiguous', 'is_cpu', 'is_cuda', 'is_distributed', 'is_floating_point',
    'is_inference', 'is_ipu', 'is_leaf', 'is_maia', 'is_meta', 'is_mkldnn', 'is_mps',
    'is_mtia', 'is_neg', 'is_nested', 'is_nonzero', 'is_pinned', 'is_quantized',
    'is_same_size', 'is_set_to', 'is_shared', 'is_signed', 'is_sparse', 'is_sparse_csr',
    'is_vulkan', 'is_xla', 'is_xpu', 'isclose', 'isfinite', 'isinf', 'isnan', 'isneginf',
    'isposinf', 'isreal', 'istft', 'item', 'itemsize', 'kron', 'kthvalue', 'layout', 'lcm',
    'lcm_', 'ldexp', 'ldexp_', 'le', 'le_', 'lerp', 'lerp_', 'less', 'less_', 'less_equal',
    'less_equal_', 'lgamma', 'lgamma_', 'log', 'log10', 'log10_', 'log1p', 'log1p_',
    'log2', 'log2_', 'log_', 'log_normal_', 'log_softmax', 'logaddexp', 'logaddexp2',
    'logcumsumexp', 'logdet', 'logical_and', 'logical_and_', 'logical_not', 'logical_not_',
    'logical_or', 'logical_or_', 'logical_xor', 'logical_xor_', 'logit', 'logit_',
    'logsumexp', 'long', 'lstsq', 'lt', 'lt_', 'lu', 'lu_solve', 'mH', 'mT', 'map2_',
    'map_', 'masked_fill', 'masked_fill_', 'masked_scatter', 'masked_scatter_',
    'masked_select', 'matmul', 'matrix_exp', 'matrix_power', 'max', 'maximum', 'mean',
    'median', 'min', 'minimum', 'mm', 'mode', 'module_load', 'moveaxis', 'movedim',
    'msort', 'mtia', 'mul', 'mul_', 'multinomial', 'multiply', 'multiply_', 'mv',
    'mvlgamma', 'mvlgamma_', 'name', 'nan_to_num', 'nan_to_num_', 'nanmean', 'nanmedian',
    'nanquantile', 'nansum', 'narrow', 'narrow_copy', 'nbytes', 'ndim', 'ndimension', 'ne',
    'ne_', 'neg', 'neg_', 'negative', 'negative_', 'nelement', 'new', 'new_empty',
    'new_empty_strided', 'new_full', 'new_ones', 'new_tensor', 'new_zeros', 'nextafter',
    'nextafter_', 'nonzero', 'nonzero_static', 'norm', 'normal_', 'not_equal',
    'not_equal_', 'numel', 'numpy', 'orgqr', 'ormqr', 'outer', 'output_nr', 'permute',
    'pin_memory', 'pinverse', 'polygamma', 'polygamma_', 'positive', 'pow', 'pow_',
    'prelu', 'prod', 'put', 'put_', 'q_per_channel_axis', 'q_per_channel_scales',
    'q_per_channel_zero_points', 'q_scale', 'q_zero_point', 'qr', 'qscheme', 'quantile',
    'rad2deg', 'rad2deg_', 'random_', 'ravel', 'real', 'reciprocal', 'reciprocal_',
    'record_stream', 'register_hook', 'register_post_accumulate_grad_hook', 'reinforce',
    'relu', 'relu_', 'remainder', 'remainder_', 'renorm', 'renorm_', 'repeat',
    'repeat_interleave', 'requires_grad', 'requires_grad_', 'reshape', 'reshape_as',
    'resize', 'resize_', 'resize_as', 'resize_as_', 'resize_as_sparse_', 'resolve_conj',
    'resolve_neg', 'retain_grad', 'retains_grad', 'roll', 'rot90', 'round', 'round_',
    'row_indices', 'rsqrt', 'rsqrt_', 'scatter', 'scatter_', 'scatter_add', 'scatter_add_',
    'scatter_reduce', 'scatter_reduce_', 'select', 'select_scatter', 'set_', 'sgn', 'sgn_',
    'shape', 'share_memory_', 'short', 'sigmoid', 'sigmoid_', 'sign', 'sign_', 'signbit',
    'sin', 'sin_', 'sinc', 'sinc_', 'sinh', 'sinh_', 'size', 'slice_inverse',
    'slice_scatter', 'slogdet', 'smm', 'softmax', 'solve', 'sort', 'sparse_dim',
    'sparse_mask', 'sparse_resize_', 'sparse_resize_and_clear_', 'split',
    'split_with_sizes', 'sqrt', 'sqrt_', 'square', 'square_', 'squeeze', 'squeeze_',
    'sspaddmm', 'std', 'stft', 'storage', 'storage_offset', 'storage_type', 'stride',
    'sub', 'sub_', 'subtract', 'subtract_', 'sum', 'sum_to_size', 'svd', 'swapaxes',
    'swapaxes_', 'swapdims', 'swapdims_', 'symeig', 't', 't_', 'take', 'take_along_dim',
    'tan', 'tan_', 'tanh', 'tanh_', 'tensor_split', 'tile', 'to', 'to_dense', 'to_mkldnn',
    'to_padded_tensor', 'to_sparse', 'to_sparse_bsc', 'to_sparse_bsr', 'to_sparse_coo',
    'to_sparse_csc', 'to_sparse_csr', 'tolist', 'topk', 'trace', 'transpose', 'transpose_',
    'triangular_solve', 'tril', 'tril_', 'triu', 'triu_', 'true_divide', 'true_divide_',
    'trunc', 'trunc_', 'type', 'type_as', 'unbind', 'unflatten', 'unfold', 'uniform_',
    'unique', 'unique_consecutive', 'unsafe_chunk', 'unsafe_split',
    'unsafe_split_with_sizes', 'unsqueeze', 'unsqueeze_', 'untyped_storage', 'values',
    'var', 'vdot', 'view', 'view_as', 'volatile', 'vsplit', 'where', 'xlogy', 'xlogy_',
    'xpu', 'zero_',
})


# torch.nn's classes and functions, each defined where its name says (module -> names), and
# neither allowed nor code-running by name: what ``reach`` knows of the names a pickled model
# holds (``torch.nn.modules.linear.Linear``, ``torch.nn.functional.relu`` as a value) without
# importing torch
_NN_CLASSES = {
    "torch.nn.attention._fa3": "_FA3Handle",
    "torch.nn.attention._fa4": "_FA4Handle",
    "torch.nn.attention._registry": "FlashAttentionHandle",
    "torch.nn.modules._functions": "BackwardHookFunction CrossMapLRN2d SyncBatchNorm",
    "torch.nn.modules.activation": (
        "CELU ELU GELU GLU Hardshrink Hardsigmoid Hardswish Hardtanh LeakyReLU LogSigmoid "
        "LogSoftmax Mish MultiheadAttention PReLU RReLU ReLU ReLU6 SELU SiLU Sigmoid Softmax "
        "Softmax2d Softmin Softplus Softshrink Softsign Tanh Tanhshrink Threshold"
    ),
    "torch.nn.modules.adaptive": "AdaptiveLogSoftmaxWithLoss _ASMoutput",
    "torch.nn.modules.batchnorm": (
        "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d "
        "SyncBatchNorm _BatchNorm _LazyNormBase _NormBase"
    ),
    "torch.nn.modules.channelshuffle": "ChannelShuffle",
    "torch.nn.modules.container": (
        "Container ModuleDict ModuleList ParameterDict ParameterList Sequential"
    ),
    "torch.nn.modules.conv": (
        "Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d LazyConv1d "
        "LazyConv2d LazyConv3d LazyConvTranspose1d LazyConvTranspose2d LazyConvTranspose3d "
        "_ConvNd _ConvTransposeMixin _ConvTransposeNd _LazyConvXdMixin"
    ),
    "torch.nn.modules.distance": "CosineSimilarity PairwiseDistance",
    "torch.nn.modules.dropout": (
        "AlphaDropout Dropout Dropout1d Dropout2d Dropout3d FeatureAlphaDropout _DropoutNd"
    ),
    "torch.nn.modules.flatten": "Flatten Unflatten",
    "torch.nn.modules.fold": "Fold Unfold",
    "torch.nn.modules.instancenorm": (
        "InstanceNorm1d InstanceNorm2d InstanceNorm3d LazyInstanceNorm1d LazyInstanceNorm2d "
        "LazyInstanceNorm3d _InstanceNorm"
    ),
    "torch.nn.modules.lazy": "LazyModuleMixin _LazyProtocol",
    "torch.nn.modules.linear": (
        "Bilinear Identity LazyLinear Linear NonDynamicallyQuantizableLinear"
    ),
    "torch.nn.modules.linear_cross_entropy_options": "LinearCrossEntropyOptions _AutoDefault",
    "torch.nn.modules.loss": (
        "BCELoss BCEWithLogitsLoss CTCLoss CosineEmbeddingLoss CrossEntropyLoss "
        "GaussianNLLLoss HingeEmbeddingLoss HuberLoss KLDivLoss L1Loss LinearCrossEntropyLoss "
        "MSELoss MarginRankingLoss MultiLabelMarginLoss MultiLabelSoftMarginLoss "
        "MultiMarginLoss NLLLoss NLLLoss2d PoissonNLLLoss SmoothL1Loss SoftMarginLoss "
        "TripletMarginLoss TripletMarginWithDistanceLoss _Loss _WeightedLoss"
    ),
    "torch.nn.modules.module": "Module _IncompatibleKeys _WrappedHook",
    "torch.nn.modules.normalization": "CrossMapLRN2d GroupNorm LayerNorm LocalResponseNorm RMSNorm",
    "torch.nn.modules.padding": (
        "CircularPad1d CircularPad2d CircularPad3d ConstantPad1d ConstantPad2d ConstantPad3d "
        "ReflectionPad1d ReflectionPad2d ReflectionPad3d ReplicationPad1d ReplicationPad2d "
        "ReplicationPad3d ZeroPad1d ZeroPad2d ZeroPad3d _CircularPadNd _ConstantPadNd "
        "_ReflectionPadNd _ReplicationPadNd"
    ),
    "torch.nn.modules.pixelshuffle": "PixelShuffle PixelUnshuffle",
    "torch.nn.modules.pooling": (
        "AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d "
        "AdaptiveMaxPool2d AdaptiveMaxPool3d AvgPool1d AvgPool2d AvgPool3d "
        "FractionalMaxPool2d FractionalMaxPool3d LPPool1d LPPool2d LPPool3d MaxPool1d "
        "MaxPool2d MaxPool3d MaxUnpool1d MaxUnpool2d MaxUnpool3d _AdaptiveAvgPoolNd "
        "_AdaptiveMaxPoolNd _AvgPoolNd _LPPoolNd _MaxPoolNd _MaxUnpoolNd"
    ),
    "torch.nn.modules.rnn": "GRU GRUCell LSTM LSTMCell RNN RNNBase RNNCell RNNCellBase",
    "torch.nn.modules.sparse": "Embedding EmbeddingBag",
    "torch.nn.modules.transformer": (
        "Transformer TransformerDecoder TransformerDecoderLayer TransformerEncoder "
        "TransformerEncoderLayer"
    ),
    "torch.nn.modules.upsampling": "Upsample UpsamplingBilinear2d UpsamplingNearest2d",
    "torch.nn.parallel": "DistributedDataParallelCPU",
    "torch.nn.parallel._functions": "Broadcast Gather ReduceAddCoalesced Scatter",
    "torch.nn.parallel.data_parallel": "DataParallel",
    "torch.nn.parallel.distributed": (
        "DistributedDataParallel _BucketCapacityConfig _BufferCommHook "
        "_BufferCommHookLocation _DDPJoinHook _DDPSink _MixedPrecision"
    ),
    "torch.nn.parameter": (
        "Buffer UninitializedBuffer UninitializedParameter UninitializedTensorMixin "
        "_BufferMeta _ParameterMeta"
    ),
    "torch.nn.utils._named_member_accessor": "NamedMemberAccessor",
    "torch.nn.utils.parametrizations": "_OrthMaps _Orthogonal _SpectralNorm _WeightNorm",
    "torch.nn.utils.parametrize": "ParametrizationList",
    "torch.nn.utils.rnn": "PackedSequence PackedSequence_",
    "torch.nn.utils.spectral_norm": (
        "SpectralNorm SpectralNormLoadStateDictPreHook SpectralNormStateDictHook"
    ),
    "torch.nn.utils.weight_norm": "WeightNorm",
}
_NN_FUNCTIONS = {
    "torch.nn._reduction": "get_enum legacy_get_enum legacy_get_string",
    "torch.nn.attention": (
        "_backend_from_string _cur_sdpa_kernel_backends _get_flash_version "
        "_raise_kernel_warnings _sdpa_kernel _sdpa_kernel_variadic "
        "activate_flash_attention_impl current_flash_attention_impl "
        "list_flash_attention_impls register_flash_attention_impl "
        "restore_flash_attention_impl sdpa_kernel"
    ),
    "torch.nn.attention._fa3": (
        "_fa3_backward_support_error _fa3_common_support_error "
        "_fa3_flash_attention_backward_impl _fa3_flash_attention_forward_impl "
        "_fa3_flash_attention_forward_impl_default "
        "_fa3_flash_attention_forward_no_dropout_inplace_impl _fa3_forward_support_error "
        "_fa3_import_module _fa3_register_kernels _fa3_run_backward _fa3_run_forward "
        "_fa3_scaled_dot_product_flash_attention_backward_impl "
        "_fa3_scaled_dot_product_flash_attention_forward_impl "
        "_fa3_scaled_dot_product_flash_attention_forward_impl_default _maybe_contiguous "
        "_transpose_dense register_flash_attention_fa3"
    ),
    "torch.nn.attention._fa4": (
        "_aten_to_fa4_window_size _fa4_backward_support_error _fa4_common_support_error "
        "_fa4_flash_attention_backward_impl _fa4_flash_attention_forward_impl "
        "_fa4_flash_attention_forward_no_dropout_inplace_impl _fa4_forward_support_error "
        "_fa4_register_kernels _fa4_run_backward _fa4_run_forward "
        "_fa4_scaled_dot_product_flash_attention_backward_impl "
        "_fa4_scaled_dot_product_flash_attention_forward_impl _transpose_dense "
        "register_flash_attention_fa4"
    ),
    "torch.nn.functional": (
        "_adaptive_max_pool1d _adaptive_max_pool2d _adaptive_max_pool3d _canonical_mask "
        "_check_key_padding_mask _check_unpool_output_size _enum_list_as_int_list "
        "_expand_single_value _fractional_max_pool2d _fractional_max_pool3d _get_softmax_dim "
        "_in_projection _in_projection_packed _is_integer _list_or_empty _max_pool1d "
        "_max_pool2d _max_pool3d _mha_shape_check _no_grad_embedding_renorm_ _none_or_dtype "
        "_threshold _unpool_output_size _verify_batch_size _verify_spatial_size "
        "adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d_with_indices "
        "adaptive_max_pool2d_with_indices adaptive_max_pool3d_with_indices affine_grid "
        "alpha_dropout assert_int_or_pair batch_norm binary_cross_entropy "
        "binary_cross_entropy_with_logits celu cosine_embedding_loss cross_entropy ctc_loss "
        "dropout dropout1d dropout2d dropout3d elu embedding embedding_bag "
        "feature_alpha_dropout fold fractional_max_pool2d_with_indices "
        "fractional_max_pool3d_with_indices gaussian_nll_loss glu grid_sample group_norm "
        "grouped_mm gumbel_softmax hardsigmoid hardswish hardtanh hinge_embedding_loss "
        "huber_loss instance_norm interpolate kl_div l1_loss layer_norm leaky_relu "
        "linear_cross_entropy local_response_norm log_softmax lp_pool1d lp_pool2d lp_pool3d "
        "margin_ranking_loss max_pool1d_with_indices max_pool2d_with_indices "
        "max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d mish mse_loss "
        "multi_head_attention_forward multi_margin_loss multilabel_margin_loss "
        "multilabel_soft_margin_loss nll_loss normalize pad poisson_nll_loss relu relu6 "
        "rms_norm rrelu scaled_grouped_mm scaled_mm selu sigmoid silu smooth_l1_loss "
        "soft_margin_loss softmax softmin softsign tanh tanhshrink triplet_margin_loss "
        "triplet_margin_with_distance_loss unfold upsample upsample_bilinear upsample_nearest"
    ),
    "torch.nn.grad": (
        "conv1d_input conv1d_weight conv2d_input conv2d_weight conv3d_input conv3d_weight"
    ),
    "torch.nn.init": (
        "_calculate_correct_fan _calculate_fan_in_and_fan_out _make_deprecate _no_grad_fill_ "
        "_no_grad_normal_ _no_grad_trunc_normal_ _no_grad_uniform_ _no_grad_zero_ "
        "calculate_gain constant_ dirac_ eye_ kaiming_normal_ kaiming_uniform_ normal_ ones_ "
        "orthogonal_ sparse_ trunc_normal_ uniform_ xavier_normal_ xavier_uniform_ zeros_"
    ),
    "torch.nn.modules.activation": "_arg_requires_grad _check_arg_device _is_make_fx_tracing",
    "torch.nn.modules.container": "_addindent",
    "torch.nn.modules.module": (
        "_addindent _forward_unimplemented _has_any_global_hook register_module_backward_hook "
        "register_module_buffer_registration_hook register_module_forward_hook "
        "register_module_forward_pre_hook register_module_full_backward_hook "
        "register_module_full_backward_pre_hook register_module_module_registration_hook "
        "register_module_parameter_registration_hook"
    ),
    "torch.nn.modules.rnn": "_apply_permutation apply_permutation",
    "torch.nn.modules.transformer": (
        "_detect_is_causal_mask _generate_square_subsequent_mask _get_activation_fn "
        "_get_clones _get_seq_len"
    ),
    "torch.nn.modules.utils": (
        "_list_with_default _ntuple _reverse_repeat_tuple "
        "consume_prefix_in_state_dict_if_present"
    ),
    "torch.nn.parallel._functions": "_get_stream",
    "torch.nn.parallel.comm": (
        "broadcast broadcast_coalesced gather reduce_add reduce_add_coalesced scatter"
    ),
    "torch.nn.parallel.data_parallel": "_check_balance data_parallel",
    "torch.nn.parallel.distributed": (
        "_cast_buffers _dump_DDP_relevant_env_vars _find_tensors "
        "_setup_mixed_precision_params _tree_flatten_with_rref _tree_unflatten_with_rref"
    ),
    "torch.nn.parallel.parallel_apply": "get_a_var parallel_apply",
    "torch.nn.parallel.replicate": (
        "_broadcast_coalesced_reshape _init_script_module _is_jit_enabled _is_script_method "
        "_is_script_module _replicatable_module replicate"
    ),
    "torch.nn.parallel.scatter_gather": (
        "_is_namedtuple gather is_namedtuple scatter scatter_kwargs"
    ),
    "torch.nn.parameter": "is_lazy",
    "torch.nn.utils._named_member_accessor": "set_tensor swap_submodule swap_tensor",
    "torch.nn.utils.clip_grad": (
        "_clip_grads_with_norm_ _get_total_norm _no_grad clip_grad_norm clip_grad_norm_ "
        "clip_grad_value_"
    ),
    "torch.nn.utils.convert_parameters": (
        "_check_param_device parameters_to_vector vector_to_parameters"
    ),
    "torch.nn.utils.fusion": (
        "fuse_conv_bn_eval fuse_conv_bn_weights fuse_linear_bn_eval fuse_linear_bn_weights"
    ),
    "torch.nn.utils.init": "skip_init",
    "torch.nn.utils.memory_format": (
        "convert_conv2d_weight_memory_format convert_conv3d_weight_memory_format"
    ),
    "torch.nn.utils.parametrizations": (
        "_is_orthogonal _make_orthogonal orthogonal spectral_norm weight_norm"
    ),
    "torch.nn.utils.parametrize": (
        "_inject_new_class _inject_property _maybe_set _register_parameter_or_buffer cached "
        "is_parametrized register_parametrization remove_parametrizations "
        "transfer_parametrizations_and_params type_before_parametrizations"
    ),
    "torch.nn.utils.rnn": (
        "_packed_sequence_init _packed_sequence_init_args bind invert_permutation "
        "pack_padded_sequence pack_sequence pad_packed_sequence pad_sequence unpack_sequence "
        "unpad_sequence"
    ),
    "torch.nn.utils.spectral_norm": "remove_spectral_norm spectral_norm",
    "torch.nn.utils.stateless": (
        "_functional_call _reparametrize_module _untie_named_tensors_map functional_call"
    ),
    "torch.nn.utils.weight_norm": "remove_weight_norm weight_norm",
}

TORCH_NN_CLASSES = frozenset(f"{module}.{name}" for module, names in _NN_CLASSES.items()
                             for name in names.split())
TORCH_NN_FUNCTIONS = frozenset(f"{module}.{name}" for module, names in _NN_FUNCTIONS.items()
                               for name in names.split())
