package docker

// ImageTar exposes imageTar.
var ImageTar = imageTar

// AgentTasks exposes agentTasks.
const AgentTasks = agentTasks
