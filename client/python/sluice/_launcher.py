"""What the launcher says about this run: which restart of it this process
belongs to, and the default scope of Once and Barrier names.

    torchrun   TORCHELASTIC_RUN_ID (the rendezvous id), TORCHELASTIC_RESTART_COUNT
    SLURM      SLURM_JOB_ID, SLURM_RESTART_COUNT (a requeued job keeps its id)
    mpirun     Open MPI's job id (OMPI_MCA_ess_base_jobid, or PMIX_NAMESPACE),
               new for every mpirun

A restart id is what every process of one restart shares; the launch id
(new_launch_id) is what tells two launches apart when the launcher gives the
same restart id twice (a torchrun relaunched by hand with a fixed
--rdzv_id, a SLURM job whose restart count is not exported).
"""
import os
import uuid


def restart_id(env=None):
    """The launcher's name for this restart of the run, or "" outside a
    launcher that names one."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_RESTART_COUNT', '0')}"
    job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
    if job:
        return f"mpi-{job}"
    return ""


def default_scope(env=None):
    """The scope of Once/Barrier names when none is given: $SLUICE_SCOPE, else
    the launcher's restart id, else "default" (shared by every run)."""
    env = os.environ if env is None else env
    return env.get("SLUICE_SCOPE") or restart_id(env) or "default"


def new_launch_id():
    """A fresh id for one launch (one restore of a checkpoint)."""
    return uuid.uuid4().hex
