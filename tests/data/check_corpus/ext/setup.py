from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # expect: EXT001

setup(
    name="fused_ops",
    ext_modules=[
        CUDAExtension(  # expect: EXT001
            name="fused_ops",
            sources=["ops.cpp", "kernel.cu"],  # expect: EXT003
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},  # expect: ANY003
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
