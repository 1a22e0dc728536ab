# gpuforge (/etc/profile.d/gpuforge.sh): login shells (ssh with a pty, `bash -l`, `docker exec -it C bash -l`)
# get the image's environment. /etc/profile resets PATH; the venv comes first again. The CUDA/NVIDIA variables
# come from the container (docker exec), from sshd's SetEnv (the ssh mode passes the container's), or, when
# neither gave them, from the image's ENV as written below at build time.
case ":${PATH}:" in
    *:/opt/venv/bin:*) ;;
    *) PATH="/opt/venv/bin:${PATH}" ;;
esac
export PATH
