#!/bin/bash
# HTCondor runs this in the job's scratch folder, where the checkpoint folder comes back
# on a restart; ferry reads the checkpoint exit code from the job ad (_CONDOR_JOB_AD).
exec ferry run -- python train.py --out run
