package main

const jobsBucketDefault = "JOBKEYS_JOBS"

func jobCommands() []*command { return nil }
