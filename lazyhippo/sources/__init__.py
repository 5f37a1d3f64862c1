"""Where documents come from: files and folders, an S3/MinIO bucket prefix, and what changed since the last look."""
