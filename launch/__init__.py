"""What a replacement is launched with: the bootstrap user data each AMI family runs."""
