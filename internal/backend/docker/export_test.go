package docker

// ImageTar exposes imageTar.
var ImageTar = imageTar
