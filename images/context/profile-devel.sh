# gpuforge (/etc/profile.d/gpuforge-devel.sh), devel images built from wheels: login shells keep CUDA_HOME's tools
# (ptxas) on PATH, after the venv and the system's, as the image's ENV has them.
case ":${PATH}:" in
    *:/opt/gpuforge/cuda/bin:*) ;;
    *) PATH="${PATH}:/opt/gpuforge/cuda/bin" ;;
esac
export PATH
